/* ncclx.ini: find the file, parse it with inih into (section, key, value, where) entries,
 * validate the core sections, and answer lookups with NCCLX_<SECTION>_<KEY> overrides. */
#include "config/config.h"
#include "config/config_keys.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <strings.h>

#include "util/debug.h"
#include "ncclx/config_value.h"

extern char** environ;

#define CONFIG_DEFAULTS_NAME "(built-in defaults)"
#define CONFIG_ENV_FILE "NCCLX_CONF_FILE"
#define CONFIG_MSG_MAX 1024

typedef struct {
  char* section;
  char* key;
  char* value;
  char* where; /* "file:line" */
  int sectionLine; /* line of the [section] header the key is under (0: none) */
} ConfigEntry;

/* The parsed file. Written only under cfgLock by load and reset; read without the lock once
 * cfgLoaded is set (entries never change until ncclxConfigReset, which is for tests). */
static pthread_mutex_t cfgLock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int cfgLoaded;
static ncclxResult_t cfgResult;
static char cfgError[CONFIG_MSG_MAX];
static char* cfgSource;
static ConfigEntry* cfgEntries;
static int cfgCount, cfgCap;

/* ---------- names ---------- */

/* NCCLX_ + SECTION + _ + KEY, upper case, with anything but letters and digits as '_'. */
static void envNameFor(const char* section, const char* key, char* buf, size_t size) {
  snprintf(buf, size, "NCCLX_%s_%s", section, key);
  for (char* p = buf; *p; p++) *p = isalnum((unsigned char)*p) ? (char)toupper((unsigned char)*p) : '_';
}

static int isPluginSection(const char* section) {
  return strncasecmp(section, "net.", 4) == 0 || strncasecmp(section, "tuner.", 6) == 0 ||
         strncasecmp(section, "profiler.", 9) == 0;
}

/* Strings that must outlive the call that produced them (env "where" texts and lower-cased
 * env keys handed to plugins). Never freed: a handful per process. */
typedef struct Interned {
  struct Interned* next;
  char text[];
} Interned;
static Interned* internList;
static pthread_mutex_t internLock = PTHREAD_MUTEX_INITIALIZER;

static const char* intern(const char* s) {
  pthread_mutex_lock(&internLock);
  Interned* it = internList;
  while (it && strcmp(it->text, s) != 0) it = it->next;
  if (it == NULL) {
    size_t len = strlen(s);
    it = malloc(sizeof(*it) + len + 1);
    if (it != NULL) {
      memcpy(it->text, s, len + 1);
      it->next = internList;
      internList = it;
    }
  }
  pthread_mutex_unlock(&internLock);
  return it ? it->text : "(out of memory)";
}

/* ---------- parsing ---------- */

/* inih reads lines through us, so we know the number of the line it is handling (this inih
 * build passes no line number to the handler). Leading blanks are dropped so that an indented
 * line is a plain key rather than inih's multi-line continuation. */
typedef struct {
  FILE* file;
  const char* path;
  int line;
  int sectionLine; /* last [section] header seen */
  int tooLongLine; /* first line that did not fit inih's buffer; parsing stops there */
  int bufLimit;
  int badLine;     /* first line with a NUL byte or text after its [section]; parsing stops */
  const char* badWhat;
  char* buf;
  size_t cap;
  int oom;
} ParseCtx;

/* "[name]" followed by nothing but blanks or a comment (inih would ignore the rest). A line
 * without ']' is left to inih, which reports it as a syntax error. */
static int sectionLineClean(const char* s) {
  const char* close = strchr(s, ']');
  if (!close) return 1;
  for (const char* p = close + 1; *p && *p != '\n'; p++) {
    if (*p == ';' || *p == '#') return 1;
    if (!isspace((unsigned char)*p)) return 0;
  }
  return 1;
}

static char* readLine(char* str, int num, void* stream) {
  ParseCtx* ctx = stream;
  ssize_t n = getline(&ctx->buf, &ctx->cap, ctx->file);
  if (n < 0) return NULL;
  ctx->line++;
  /* A NUL would end the line there without a word: the rest of the value is lost. */
  if (strlen(ctx->buf) != (size_t)n) {
    ctx->badLine = ctx->line;
    ctx->badWhat = "a NUL byte inside the line (a binary file, or a stray byte?)";
    return NULL;
  }
  /* CRLF files (written on Windows): the \r is not part of the line. */
  if (n >= 2 && ctx->buf[n - 2] == '\r' && ctx->buf[n - 1] == '\n') ctx->buf[n - 2] = '\n', ctx->buf[n - 1] = '\0';
  else if (n >= 1 && ctx->buf[n - 1] == '\r') ctx->buf[n - 1] = '\0';
  const char* s = ctx->buf;
  while (*s == ' ' || *s == '\t') s++;
  size_t len = strlen(s);
  if (*s == '[' && !sectionLineClean(s)) {
    ctx->badLine = ctx->line;
    ctx->badWhat = "text after the [section] header (only a ; or # comment may follow it)";
    return NULL;
  }
  if (len + 1 > (size_t)num) {
    ctx->tooLongLine = ctx->line;
    ctx->bufLimit = num;
    return NULL;
  }
  if (*s == '[') ctx->sectionLine = ctx->line;
  memcpy(str, s, len + 1);
  return str;
}

static char* trimmedCopy(const char* s) {
  while (isspace((unsigned char)*s)) s++;
  size_t len = strlen(s);
  while (len > 0 && isspace((unsigned char)s[len - 1])) len--;
  return strndup(s, len);
}

static void freeEntry(ConfigEntry* e) {
  free(e->section);
  free(e->key);
  free(e->value);
  free(e->where);
}

static ConfigEntry* findEntry(const char* section, const char* key) {
  for (int i = 0; i < cfgCount; i++)
    if (strcasecmp(cfgEntries[i].section, section) == 0 && strcasecmp(cfgEntries[i].key, key) == 0)
      return &cfgEntries[i];
  return NULL;
}

static int onKey(void* user, const char* section, const char* key, const char* value) {
  ParseCtx* ctx = user;
  if (key == NULL || key[0] == '\0' || value == NULL) return 0; /* "= value": a syntax error */
  char whereBuf[PATH_MAX + 32];
  snprintf(whereBuf, sizeof(whereBuf), "%s:%d", ctx->path, ctx->line);
  ConfigEntry e = {trimmedCopy(section), strdup(key), strdup(value), strdup(whereBuf), ctx->sectionLine};
  if (!e.section || !e.key || !e.value || !e.where) goto oom;

  ConfigEntry* old = findEntry(e.section, e.key);
  if (old != NULL) {
    WARN("config: %s: [%s] %s is set again (first at %s); the later value '%s' wins", e.where, e.section,
         e.key, old->where, e.value);
    freeEntry(old);
    *old = e;
    return 1;
  }
  if (cfgCount == cfgCap) {
    int cap = cfgCap ? cfgCap * 2 : 32;
    ConfigEntry* grown = realloc(cfgEntries, (size_t)cap * sizeof(*grown));
    if (grown == NULL) goto oom;
    cfgEntries = grown;
    cfgCap = cap;
  }
  cfgEntries[cfgCount++] = e;
  return 1;
oom:
  freeEntry(&e);
  ctx->oom = 1;
  return 0;
}

static void clearEntries(void) {
  for (int i = 0; i < cfgCount; i++) freeEntry(&cfgEntries[i]);
  free(cfgEntries);
  cfgEntries = NULL;
  cfgCount = cfgCap = 0;
}

/* Text of line `lineno` of path (for syntax error messages), or "" when unavailable. */
static void fetchLine(const char* path, int lineno, char* out, size_t size) {
  out[0] = '\0';
  FILE* f = fopen(path, "r");
  if (f == NULL) return;
  char* buf = NULL;
  size_t cap = 0;
  for (int i = 1; getline(&buf, &cap, f) >= 0; i++) {
    if (i != lineno) continue;
    buf[strcspn(buf, "\r\n")] = '\0';
    snprintf(out, size, "%.120s%s", buf, strlen(buf) > 120 ? "..." : "");
    break;
  }
  free(buf);
  fclose(f);
}

/* Records the load failure: the message is replayed to every later caller of Load. */
static ncclxResult_t loadFail(ncclxResult_t res, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclxResult_t loadFail(ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cfgError, sizeof(cfgError), fmt, ap);
  va_end(ap);
  return res;
}

static ncclxResult_t parseFile(FILE* f, const char* path) {
  ParseCtx ctx = {.file = f, .path = path};
  int rc = ini_parse_stream(readLine, &ctx, onKey, &ctx);
  free(ctx.buf);
  if (ctx.oom) return loadFail(ncclxSystemError, "%s: out of memory while parsing", path);
  if (ctx.badLine && (rc <= 0 || rc >= ctx.badLine)) {
    char text[160];
    fetchLine(path, ctx.badLine, text, sizeof(text));
    return loadFail(ncclxInvalidUsage, "%s:%d: %s in '%s'", path, ctx.badLine, ctx.badWhat, text);
  }
  if (rc > 0 && (ctx.tooLongLine == 0 || rc < ctx.tooLongLine)) {
    char text[160];
    fetchLine(path, rc, text, sizeof(text));
    return loadFail(ncclxInvalidUsage,
                    "%s:%d: syntax error in '%s' (expected [section], key = value, or a ; or # comment)",
                    path, rc, text);
  }
  if (ctx.tooLongLine)
    return loadFail(ncclxInvalidUsage, "%s:%d: line longer than %d characters", path,
                    ctx.tooLongLine, ctx.bufLimit - 2);
  if (rc < 0) return loadFail(ncclxSystemError, "%s: cannot parse (inih error %d)", path, rc);
  return ncclxSuccess;
}

/* Core keys must be valid wherever they come from; everything else in core sections is a
 * warning (a typo there would otherwise be silently ignored). */
static ncclxResult_t validateStore(void) {
  char msg[256], known[256], envName[256];
  for (int i = 0; i < cfgCount; i++) {
    const ConfigEntry* e = &cfgEntries[i];
    if (isPluginSection(e->section)) continue;
    if (!isCoreSection(e->section)) {
      int first = 1; /* one warning per unknown section */
      for (int j = 0; j < i && first; j++)
        if (strcasecmp(cfgEntries[j].section, e->section) == 0) first = 0;
      if (first && e->section[0] == '\0')
        WARN("config: %s: key '%s' outside any [section] ignored", e->where, e->key);
      else if (first)
        WARN("config: %s:%d: unknown section [%s] ignored (known: core, net, tuner, profiler, debug, and "
             "net.*, tuner.*, profiler.* for plugins)", cfgSource, e->sectionLine, e->section);
      continue;
    }
    const KnownKey* k = findKnownKey(e->section, e->key);
    if (k == NULL) {
      knownKeysOf(e->section, known, sizeof(known));
      WARN("config: %s: unknown key '%s' in [%s] ignored (known: %s)", e->where, e->key, e->section, known);
      continue;
    }
    if (!validateValue(k, e->value, msg, sizeof(msg)))
      return loadFail(ncclxInvalidUsage, "%s: [%s] %s = '%s': %s", e->where, k->section, k->key,
                      e->value, msg);
  }
  const KnownKey* k;
  for (size_t i = 0; (k = configKnownKey(i)) != NULL; i++) {
    envNameFor(k->section, k->key, envName, sizeof(envName));
    const char* v = getenv(envName);
    if (v != NULL && !validateValue(k, v, msg, sizeof(msg)))
      return loadFail(ncclxInvalidUsage, "env %s: [%s] %s = '%s': %s", envName, k->section,
                      k->key, v, msg);
  }
  return ncclxSuccess;
}

/* fopen(dir, "r") succeeds on Linux and reads as an empty file: say so instead. */
static int isDirectory(FILE* f) {
  struct stat st;
  return fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode);
}

/* Opens the first config file of the search order. *f = NULL (and success) means none. */
static ncclxResult_t locate(FILE** f, char** path) {
  *f = NULL;
  *path = NULL;
  const char* forced = getenv(CONFIG_ENV_FILE);
  if (forced != NULL && forced[0] != '\0') {
    *f = fopen(forced, "r");
    if (*f == NULL)
      return loadFail(ncclxInvalidUsage, "%s=%s: cannot open: %s", CONFIG_ENV_FILE, forced, strerror(errno));
    if (isDirectory(*f)) {
      fclose(*f);
      *f = NULL;
      return loadFail(ncclxInvalidUsage, "%s=%s: is a directory, not an ini file", CONFIG_ENV_FILE, forced);
    }
    *path = strdup(forced);
    return ncclxSuccess;
  }
  char home[PATH_MAX];
  const char* homeDir = getenv("HOME");
  home[0] = '\0';
  if (homeDir != NULL && homeDir[0] != '\0') snprintf(home, sizeof(home), "%s/.ncclx.ini", homeDir);
  const char* candidates[] = {"./ncclx.ini", home, "/etc/ncclx.ini"};
  for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++) {
    if (candidates[i][0] == '\0') continue;
    *f = fopen(candidates[i], "r");
    if (*f != NULL && isDirectory(*f)) {
      fclose(*f);
      *f = NULL;
      return loadFail(ncclxInvalidUsage, "%s: is a directory, not an ini file", candidates[i]);
    }
    if (*f != NULL) {
      *path = strdup(candidates[i]);
      return ncclxSuccess;
    }
    /* A file that exists but cannot be read is a mistake worth stopping for. */
    if (errno != ENOENT && errno != ENOTDIR)
      return loadFail(ncclxInvalidUsage, "%s: cannot open: %s", candidates[i], strerror(errno));
  }
  return ncclxSuccess;
}

static ncclxResult_t loadLocked(void) {
  cfgError[0] = '\0';
  FILE* f = NULL;
  char* path = NULL;
  ncclxResult_t res = locate(&f, &path);
  if (res == ncclxSuccess && f != NULL && path == NULL) res = loadFail(ncclxSystemError, "out of memory");
  if (res == ncclxSuccess && f != NULL) res = parseFile(f, path);
  if (f != NULL) fclose(f);
  free(cfgSource);
  cfgSource = path;
  if (res == ncclxSuccess) res = validateStore();
  if (res == ncclxSuccess && cfgSource != NULL)
    INFO(NCCLX_LOG_INIT | NCCLX_LOG_ENV, "config: using %s (%d key(s))", cfgSource, cfgCount);
  else if (res == ncclxSuccess)
    INFO(NCCLX_LOG_INIT | NCCLX_LOG_ENV, "config: no ncclx.ini found ($%s, ./ncclx.ini, "
         "~/.ncclx.ini, /etc/ncclx.ini); using the built-in defaults", CONFIG_ENV_FILE);
  else
    clearEntries(); /* a failed load answers lookups from the environment only */
  return res;
}

ncclxResult_t ncclxConfigLoad(void) {
  if (!atomic_load_explicit(&cfgLoaded, memory_order_acquire)) {
    pthread_mutex_lock(&cfgLock);
    if (!atomic_load_explicit(&cfgLoaded, memory_order_relaxed)) {
      cfgResult = loadLocked();
      atomic_store_explicit(&cfgLoaded, 1, memory_order_release);
    }
    pthread_mutex_unlock(&cfgLock);
  }
  if (cfgResult != ncclxSuccess) return ncclxSetError(cfgResult, "config: %s", cfgError);
  return ncclxSuccess;
}

const char* ncclxConfigSource(void) {
  (void)ncclxConfigLoad();
  return cfgSource ? cfgSource : CONFIG_DEFAULTS_NAME;
}

void ncclxConfigReset(void) {
  pthread_mutex_lock(&cfgLock);
  clearEntries();
  free(cfgSource);
  cfgSource = NULL;
  cfgResult = ncclxSuccess;
  cfgError[0] = '\0';
  atomic_store_explicit(&cfgLoaded, 0, memory_order_release);
  pthread_mutex_unlock(&cfgLock);
}

/* ---------- lookups ---------- */

/* Value and where it came from, environment first; NULL when set nowhere. */
static const char* lookup(const char* section, const char* key, char* where, size_t whereSize) {
  char envName[256];
  envNameFor(section, key, envName, sizeof(envName));
  const char* v = getenv(envName);
  if (v != NULL) {
    if (where) snprintf(where, whereSize, "env %s", envName);
    return v;
  }
  if (!atomic_load_explicit(&cfgLoaded, memory_order_acquire)) (void)ncclxConfigLoad();
  const ConfigEntry* e = findEntry(section, key);
  if (e == NULL) return NULL;
  if (where) snprintf(where, whereSize, "%s", e->where);
  return e->value;
}

const char* ncclxConfigGet(const char* section, const char* key) {
  if (section == NULL || key == NULL) return NULL;
  return lookup(section, key, NULL, 0);
}

ncclxResult_t ncclxConfigGetInt(const char* section, const char* key, long def, long min, long max,
                                long* out) {
  NCCLX_CHECK(ncclxConfigLoad());
  char where[PATH_MAX + 64];
  const char* v = lookup(section, key, where, sizeof(where));
  if (v == NULL) return *out = def, ncclxSuccess;
  long l;
  if (!parseLong(v, &l))
    return ncclxSetError(ncclxInvalidUsage, "%s: [%s] %s = '%s': not an integer", where, section, key, v);
  if (l < min || l > max)
    return ncclxSetError(ncclxInvalidUsage, "%s: [%s] %s = %ld: out of range [%ld, %ld]", where,
                         section, key, l, min, max);
  *out = l;
  return ncclxSuccess;
}

ncclxResult_t ncclxConfigGetBool(const char* section, const char* key, int def, int* out) {
  NCCLX_CHECK(ncclxConfigLoad());
  char where[PATH_MAX + 64];
  const char* v = lookup(section, key, where, sizeof(where));
  if (v == NULL) return *out = def, ncclxSuccess;
  if (!parseBool(v, out))
    return ncclxSetError(ncclxInvalidUsage,
                         "%s: [%s] %s = '%s': not a boolean (true/false, 1/0, yes/no, on/off)",
                         where, section, key, v);
  return ncclxSuccess;
}

ncclxResult_t ncclxConfigGetSize(const char* section, const char* key, size_t def, size_t* out) {
  NCCLX_CHECK(ncclxConfigLoad());
  char where[PATH_MAX + 64];
  const char* v = lookup(section, key, where, sizeof(where));
  if (v == NULL) return *out = def, ncclxSuccess;
  if (ncclxParseSize(v, out) != 0)
    return ncclxSetError(ncclxInvalidUsage,
                         "%s: [%s] %s = '%s': not a size (bytes, or a number with K, M or G)",
                         where, section, key, v);
  return ncclxSuccess;
}

/* ---------- the plugin-facing view ---------- */

/* Handles only hold the name; they are never freed, so a plugin may keep one for its life
 * (and across ncclxConfigReset in tests). */
struct ncclxConfigSection {
  struct ncclxConfigSection* next;
  const char* name; /* points just past the struct */
};
static struct ncclxConfigSection* sectionList;
static struct ncclxConfigSection emptySection = {NULL, ""}; /* fallback when out of memory */

const ncclxConfigSection_t* ncclxConfigSection(const char* section) {
  if (section == NULL) section = "";
  pthread_mutex_lock(&internLock);
  struct ncclxConfigSection* s = sectionList;
  while (s && strcasecmp(s->name, section) != 0) s = s->next;
  if (s == NULL) {
    size_t len = strlen(section);
    s = malloc(sizeof(*s) + len + 1);
    if (s != NULL) {
      char* name = (char*)(s + 1);
      memcpy(name, section, len + 1);
      s->name = name;
      s->next = sectionList;
      sectionList = s;
    }
  }
  pthread_mutex_unlock(&internLock);
  return s ? s : &emptySection;
}

static const char* apiGet(const ncclxConfigSection_t* section, const char* key) {
  if (section == NULL || key == NULL) return NULL;
  return ncclxConfigGet(section->name, key);
}

/* Index order: the file's keys of this section, then (plugin sections only) variables
 * NCCLX_<SECTION>_<KEY> naming keys the file does not have. Core sections skip the second
 * part: the prefix NCCLX_NET_ would also match every NCCLX_NET_<PLUGIN>_* variable. */
static int apiEntry(const ncclxConfigSection_t* section, int index, const char** key,
                    const char** value, const char** where) {
  if (section == NULL || index < 0) return 0;
  if (!atomic_load_explicit(&cfgLoaded, memory_order_acquire)) (void)ncclxConfigLoad();
  char whereBuf[PATH_MAX + 64];
  for (int i = 0; i < cfgCount; i++) {
    const ConfigEntry* e = &cfgEntries[i];
    if (strcasecmp(e->section, section->name) != 0 || index-- > 0) continue;
    const char* v = lookup(e->section, e->key, whereBuf, sizeof(whereBuf));
    if (key) *key = e->key;
    if (value) *value = v;
    if (where) *where = (v == e->value) ? e->where : intern(whereBuf);
    return 1;
  }
  if (!isPluginSection(section->name)) return 0;
  char prefix[256];
  envNameFor(section->name, "", prefix, sizeof(prefix)); /* "NCCLX_NET_OFI_" */
  size_t plen = strlen(prefix);
  for (char** env = environ; env && *env; env++) {
    const char* eq = strchr(*env, '=');
    if (eq == NULL || strncmp(*env, prefix, plen) != 0 || (size_t)(eq - *env) <= plen) continue;
    char lower[256];
    size_t klen = (size_t)(eq - *env) - plen;
    if (klen >= sizeof(lower)) continue;
    for (size_t j = 0; j < klen; j++) lower[j] = (char)tolower((unsigned char)(*env)[plen + j]);
    lower[klen] = '\0';
    if (findEntry(section->name, lower) != NULL || index-- > 0) continue;
    char envWhere[300];
    snprintf(envWhere, sizeof(envWhere), "env %.*s", (int)(eq - *env), *env);
    if (key) *key = intern(lower);
    if (value) *value = eq + 1;
    if (where) *where = intern(envWhere);
    return 1;
  }
  return 0;
}

const ncclxConfigApi_t ncclxConfigApi = {.get = apiGet, .entry = apiEntry};
