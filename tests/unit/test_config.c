/* ncclx.ini loading: search order, syntax and value errors with file:line, warnings for
 * unknown keys, duplicate keys, environment overrides and the plugin-facing section API. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "ncclx/config_value.h"
#include "util/debug.h"

static int failures;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
      failures++;                                                              \
    }                                                                          \
  } while (0)
#define CHECK_CONTAINS(hay, needle)                                            \
  do {                                                                         \
    const char* h_ = (hay);                                                    \
    if (h_ == NULL || strstr(h_, (needle)) == NULL) {                          \
      fprintf(stderr, "FAIL %s:%d: '%s' not found in: %s\n", __FILE__, __LINE__, \
              (needle), h_ ? h_ : "(null)");                                   \
      failures++;                                                              \
    }                                                                          \
  } while (0)

static char tmpDir[] = "/tmp/ncclx-test-config-XXXXXX";

/* Writes text to tmpDir/name and points NCCLX_CONF_FILE at it. */
static const char* useIni(const char* name, const char* text) {
  static char path[512];
  snprintf(path, sizeof(path), "%s/%s", tmpDir, name);
  FILE* f = fopen(path, "w");
  if (f == NULL) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  setenv("NCCLX_CONF_FILE", path, 1);
  ncclxConfigReset();
  ncclxClearThreadError();
  return path;
}

/* ---- stderr capture (the log goes there) ---- */
static int savedStderr = -1;
static char capturePath[600];
static char captured[65536];

static void captureStart(void) {
  fflush(stderr);
  snprintf(capturePath, sizeof(capturePath), "%s/stderr.txt", tmpDir);
  FILE* f = fopen(capturePath, "w");
  if (f == NULL) exit(1);
  savedStderr = dup(2);
  dup2(fileno(f), 2);
  fclose(f);
}

static const char* captureEnd(void) {
  fflush(stderr);
  dup2(savedStderr, 2);
  close(savedStderr);
  FILE* f = fopen(capturePath, "r");
  size_t n = f ? fread(captured, 1, sizeof(captured) - 1, f) : 0;
  captured[n] = '\0';
  if (f) fclose(f);
  fputs(captured, stderr); /* keep it visible in the test log */
  return captured;
}

static void testGoodFile(void) {
  const char* path = useIni("good.ini",
                            "; comment\n"
                            "# another comment\n"
                            "[core]\n"
                            "timeout_s = 30\n"
                            "lazy_connect = off\n"
                            "chunk_bytes = 1M\n"
                            "  plugin_path = /a:/b\n"
                            "host_id = rack1,node3\n"
                            "[net]\n"
                            "plugin = ib, ofi ,socket\n"
                            "device = 1\n"
                            "[tuner]\n"
                            "plugin = none\n"
                            "[debug]\n"
                            "level = info\n"
                            "[net.ofi]\n"
                            "provider = tcp ; inline comment\n"
                            "max-eps = 4\n");
  captureStart();
  ncclxResult_t res = ncclxConfigLoad();
  const char* log = captureEnd();
  CHECK(res == ncclxSuccess);
  CHECK(strstr(log, "WARN") == NULL);
  CHECK(strcmp(ncclxConfigSource(), path) == 0);
  long l = 0;
  int b = 1;
  size_t sz = 0;
  CHECK(ncclxConfigGetInt("core", "timeout_s", 600, 0, 1000, &l) == ncclxSuccess && l == 30);
  CHECK(ncclxConfigGetBool("core", "lazy_connect", 1, &b) == ncclxSuccess && b == 0);
  CHECK(ncclxConfigGetSize("core", "chunk_bytes", 1, &sz) == ncclxSuccess && sz == 1048576);
  CHECK(ncclxConfigGet("core", "plugin_path") && strcmp(ncclxConfigGet("core", "plugin_path"), "/a:/b") == 0);
  /* A host identity is free text: commas are part of it, not a list (KEY_TEXT). */
  CHECK(ncclxConfigGet("core", "host_id") && strcmp(ncclxConfigGet("core", "host_id"), "rack1,node3") == 0);
  CHECK(ncclxConfigGet("net", "plugin") && strcmp(ncclxConfigGet("net", "plugin"), "ib, ofi ,socket") == 0);
  CHECK(ncclxConfigGet("NET.OFI", "Provider") && strcmp(ncclxConfigGet("net.ofi", "provider"), "tcp") == 0);
  /* Unset keys: NULL raw, the default typed. */
  CHECK(ncclxConfigGet("core", "nothing") == NULL);
  CHECK(ncclxConfigGetInt("core", "nothing", 7, 0, 10, &l) == ncclxSuccess && l == 7);
  CHECK(ncclxConfigGetSize("net.socket", "buffer_bytes", 4u << 20, &sz) == ncclxSuccess && sz == 4u << 20);

  /* The plugin view: get and entry iterate the section with where = file:line. */
  const ncclxConfigSection_t* sec = ncclxConfigSection("net.ofi");
  CHECK(sec != NULL && sec == ncclxConfigSection("net.ofi"));
  CHECK(ncclxConfigApi.get(sec, "max-eps") && strcmp(ncclxConfigApi.get(sec, "max-eps"), "4") == 0);
  const char *k = NULL, *v = NULL, *w = NULL;
  int n = 0;
  char expectWhere[600];
  while (ncclxConfigApi.entry(sec, n, &k, &v, &w)) {
    if (n == 0) {
      CHECK(strcmp(k, "provider") == 0 && strcmp(v, "tcp") == 0);
      snprintf(expectWhere, sizeof(expectWhere), "%s:17", path);
      CHECK(strcmp(w, expectWhere) == 0);
    }
    n++;
  }
  CHECK(n == 2);
  CHECK(ncclxConfigApi.entry(ncclxConfigSection("net.none"), 0, &k, &v, &w) == 0);
}

static void testSyntaxError(void) {
  const char* path = useIni("syntax.ini", "[core]\ntimeout_s = 5\n[net\nplugin = socket\n");
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  char expect[600];
  snprintf(expect, sizeof(expect), "%s:3: syntax error", path);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);
  CHECK_CONTAINS(ncclxThreadLastError(), "[net");
  /* The error sticks until reset, and typed lookups report it too. */
  long l;
  ncclxClearThreadError();
  CHECK(ncclxConfigGetInt("core", "timeout_s", 1, 0, 10, &l) == ncclxInvalidUsage);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);

  path = useIni("nokey.ini", "[core]\n= 5\n");
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  snprintf(expect, sizeof(expect), "%s:2:", path);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);

  char longLine[400];
  memset(longLine, 'x', sizeof(longLine));
  memcpy(longLine, "plugin_path = ", 14);
  longLine[sizeof(longLine) - 1] = '\0';
  char text[600];
  snprintf(text, sizeof(text), "[core]\n%s\n", longLine);
  path = useIni("long.ini", text);
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  snprintf(expect, sizeof(expect), "%s:2: line longer than", path);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);
}

/* Files as they come from other tools: CRLF line ends, NUL bytes, text after a section
 * header, a directory where a file is expected. Each is read right or refused with file:line. */
static void testHostileFiles(void) {
  char text[600], expect[700];
  /* CRLF: the \r is not content and does not count toward the line limit (198 characters). */
  char value[185];
  memset(value, 'x', sizeof(value) - 1);
  value[sizeof(value) - 1] = '\0';
  snprintf(text, sizeof(text), "[core]\r\ntimeout_s = 5\r\nplugin_path = %s\r\n", value);
  useIni("crlf.ini", text);
  long l;
  CHECK(ncclxConfigLoad() == ncclxSuccess);
  CHECK(ncclxConfigGetInt("core", "timeout_s", 1, 0, 10, &l) == ncclxSuccess && l == 5);
  const char* pp = ncclxConfigGet("core", "plugin_path");
  CHECK(pp && strlen(pp) == sizeof(value) - 1 && strchr(pp, '\r') == NULL);

  /* A NUL byte inside a value: refused, not silently truncated. */
  const char* path = useIni("nul.ini", "");
  FILE* f = fopen(path, "w");
  static const char withNul[] = "[core]\nplugin_path = /a\0/b\n";
  fwrite(withNul, 1, sizeof(withNul) - 1, f);
  fclose(f);
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  snprintf(expect, sizeof(expect), "%s:2: a NUL byte", path);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);

  /* "[core] junk" is not "[core]"; a comment after the header is fine. */
  path = useIni("junk.ini", "[core] junk\ntimeout_s = 5\n");
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  snprintf(expect, sizeof(expect), "%s:1: text after the [section] header", path);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);
  useIni("comment.ini", "[core] ; the core\ntimeout_s = 5\n");
  CHECK(ncclxConfigLoad() == ncclxSuccess);

  /* NCCLX_CONF_FILE naming a directory. */
  setenv("NCCLX_CONF_FILE", tmpDir, 1);
  ncclxConfigReset();
  ncclxClearThreadError();
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  CHECK_CONTAINS(ncclxThreadLastError(), "is a directory");
  unsetenv("NCCLX_CONF_FILE");
  ncclxConfigReset();
}

static void expectBadValue(const char* text, int line, const char* key, const char* why) {
  const char* path = useIni("bad.ini", text);
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  char expect[600];
  snprintf(expect, sizeof(expect), "%s:%d: %s", path, line, key);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);
  CHECK_CONTAINS(ncclxThreadLastError(), why);
}

static void testBadValues(void) {
  expectBadValue("[core]\ntimeout_s = ten\n", 2, "[core] timeout_s", "not an integer");
  expectBadValue("[core]\n\ntimeout_s = -1\n", 3, "[core] timeout_s", "out of range");
  expectBadValue("[core]\nlazy_connect = maybe\n", 2, "[core] lazy_connect", "not a boolean");
  expectBadValue("[core]\nchunk_bytes = 12Q\n", 2, "[core] chunk_bytes", "not a size");
  expectBadValue("[core]\nchunk_bytes = 1K\n", 2, "[core] chunk_bytes", "out of range");
  expectBadValue("[net]\nplugin = ib,,socket\n", 2, "[net] plugin", "empty name");
  expectBadValue("[net]\ndevice = x\n", 2, "[net] device", "not an integer");
  /* The load-time bound is the one transportsOpen reads with (NCCLX_NET_DEVICE_MAX). */
  expectBadValue("[net]\ndevice = 1048577\n", 2, "[net] device", "out of range [0, 1048576]");
  expectBadValue("[tuner]\nplugin = a,b\n", 2, "[tuner] plugin", "one plugin name");
  expectBadValue("[debug]\nlevel = LOUD\n", 2, "[debug] level", "not one of");

  /* A typed lookup of a plugin key names where the bad value came from. */
  const char* path = useIni("badplugin.ini", "[net.socket]\nnsocks = many\n");
  CHECK(ncclxConfigLoad() == ncclxSuccess);
  long l;
  CHECK(ncclxConfigGetInt("net.socket", "nsocks", 2, 1, 16, &l) == ncclxInvalidUsage);
  char expect[600];
  snprintf(expect, sizeof(expect), "%s:2: [net.socket] nsocks = 'many': not an integer", path);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);
  useIni("range.ini", "[net.socket]\nnsocks = 17\n");
  CHECK(ncclxConfigGetInt("net.socket", "nsocks", 2, 1, 16, &l) == ncclxInvalidUsage);
  CHECK_CONTAINS(ncclxThreadLastError(), "out of range [1, 16]");
}

static void testWarnings(void) {
  const char* path = useIni("warn.ini",
                            "[core]\n"
                            "timeout_s = 5\n"
                            "bogus = 1\n"
                            "[mystery]\n"
                            "a = b\n"
                            "[core]\n"
                            "timeout_s = 9\n");
  captureStart();
  ncclxResult_t res = ncclxConfigLoad();
  const char* log = captureEnd();
  CHECK(res == ncclxSuccess);
  char expect[600];
  snprintf(expect, sizeof(expect), "%s:3: unknown key 'bogus' in [core]", path);
  CHECK_CONTAINS(log, expect);
  snprintf(expect, sizeof(expect), "%s:4: unknown section [mystery]", path);
  CHECK_CONTAINS(log, expect);
  snprintf(expect, sizeof(expect), "%s:7: [core] timeout_s is set again (first at %s:2)", path, path);
  CHECK_CONTAINS(log, expect);
  long l;
  CHECK(ncclxConfigGetInt("core", "timeout_s", 600, 0, 100, &l) == ncclxSuccess && l == 9);
}

static void testEnvOverride(void) {
  useIni("env.ini", "[core]\ntimeout_s = 5\n[net.ofi]\nprovider = verbs\n");
  setenv("NCCLX_CORE_TIMEOUT_S", "42", 1);
  setenv("NCCLX_NET_OFI_PROVIDER", "tcp", 1);
  setenv("NCCLX_NET_OFI_DOMAIN", "lo", 1);
  setenv("NCCLX_TUNER_MY_RULES_MAX_SIZE", "3K", 1);
  CHECK(ncclxConfigLoad() == ncclxSuccess);
  long l = 0;
  CHECK(ncclxConfigGetInt("core", "timeout_s", 600, 0, 100, &l) == ncclxSuccess && l == 42);
  CHECK(strcmp(ncclxConfigGet("net.ofi", "provider"), "tcp") == 0);
  size_t sz = 0;
  CHECK(ncclxConfigGetSize("tuner.my-rules", "max-size", 0, &sz) == ncclxSuccess && sz == 3072);

  /* entry: the file's key shows the env value and env as where; then env-only keys. */
  const ncclxConfigSection_t* sec = ncclxConfigSection("net.ofi");
  const char *k, *v, *w;
  CHECK(ncclxConfigApi.entry(sec, 0, &k, &v, &w) == 1);
  CHECK(strcmp(k, "provider") == 0 && strcmp(v, "tcp") == 0 && strcmp(w, "env NCCLX_NET_OFI_PROVIDER") == 0);
  CHECK(ncclxConfigApi.entry(sec, 1, &k, &v, &w) == 1);
  CHECK(strcmp(k, "domain") == 0 && strcmp(v, "lo") == 0 && strcmp(w, "env NCCLX_NET_OFI_DOMAIN") == 0);
  CHECK(ncclxConfigApi.entry(sec, 2, &k, &v, &w) == 0);

  /* A bad core value from the environment fails the load, naming the variable. */
  setenv("NCCLX_CORE_LAZY_CONNECT", "sometimes", 1);
  ncclxConfigReset();
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  CHECK_CONTAINS(ncclxThreadLastError(), "env NCCLX_CORE_LAZY_CONNECT: [core] lazy_connect = 'sometimes'");
  unsetenv("NCCLX_CORE_LAZY_CONNECT");
  unsetenv("NCCLX_CORE_TIMEOUT_S");
  unsetenv("NCCLX_NET_OFI_PROVIDER");
  unsetenv("NCCLX_NET_OFI_DOMAIN");
  unsetenv("NCCLX_TUNER_MY_RULES_MAX_SIZE");
}

static void testMissingFile(void) {
  char path[600];
  snprintf(path, sizeof(path), "%s/does-not-exist.ini", tmpDir);
  setenv("NCCLX_CONF_FILE", path, 1);
  ncclxConfigReset();
  CHECK(ncclxConfigLoad() == ncclxInvalidUsage);
  char expect[700];
  snprintf(expect, sizeof(expect), "NCCLX_CONF_FILE=%s: cannot open", path);
  CHECK_CONTAINS(ncclxThreadLastError(), expect);
}

/* No NCCLX_CONF_FILE: ./ncclx.ini, then ~/.ncclx.ini, then defaults. */
static void testSearchOrder(void) {
  if (access("/etc/ncclx.ini", F_OK) == 0) {
    printf("skipping search order checks: /etc/ncclx.ini exists on this machine\n");
    return;
  }
  char cwd[512], home[600], homeIni[700];
  if (getcwd(cwd, sizeof(cwd)) == NULL) return;
  snprintf(home, sizeof(home), "%s/home", tmpDir);
  snprintf(homeIni, sizeof(homeIni), "%s/.ncclx.ini", home);
  CHECK(mkdir(home, 0700) == 0);
  const char* oldHome = getenv("HOME");
  char savedHome[512];
  snprintf(savedHome, sizeof(savedHome), "%s", oldHome ? oldHome : "");
  unsetenv("NCCLX_CONF_FILE");
  setenv("HOME", home, 1);
  CHECK(chdir(tmpDir) == 0);

  ncclxConfigReset();
  CHECK(ncclxConfigLoad() == ncclxSuccess);
  CHECK(strcmp(ncclxConfigSource(), "(built-in defaults)") == 0);

  FILE* f = fopen(homeIni, "w");
  fputs("[core]\ntimeout_s = 11\n", f);
  fclose(f);
  ncclxConfigReset();
  CHECK(strcmp(ncclxConfigSource(), homeIni) == 0);
  CHECK(strcmp(ncclxConfigGet("core", "timeout_s"), "11") == 0);

  f = fopen("ncclx.ini", "w");
  fputs("[core]\ntimeout_s = 12\n", f);
  fclose(f);
  ncclxConfigReset();
  CHECK(strcmp(ncclxConfigSource(), "./ncclx.ini") == 0);
  CHECK(strcmp(ncclxConfigGet("core", "timeout_s"), "12") == 0);
  unlink("ncclx.ini");
  unlink(homeIni);
  rmdir(home);
  CHECK(chdir(cwd) == 0);
  if (oldHome) setenv("HOME", savedHome, 1);
  else unsetenv("HOME");
}

static void testSizes(void) {
  useIni("sizes.ini",
         "[net.socket]\na = 4096\nb = 4M\nc = 1G\nd = 512KiB\ne = 2kb\nf = 1T\ng = -1\nh = 99999999999999999999G\n");
  size_t sz = 0;
  CHECK(ncclxConfigGetSize("net.socket", "a", 0, &sz) == ncclxSuccess && sz == 4096);
  CHECK(ncclxConfigGetSize("net.socket", "b", 0, &sz) == ncclxSuccess && sz == 4u << 20);
  CHECK(ncclxConfigGetSize("net.socket", "c", 0, &sz) == ncclxSuccess && sz == 1u << 30);
  CHECK(ncclxConfigGetSize("net.socket", "d", 0, &sz) == ncclxSuccess && sz == 512u << 10);
  CHECK(ncclxConfigGetSize("net.socket", "e", 0, &sz) == ncclxSuccess && sz == 2048);
  CHECK(ncclxConfigGetSize("net.socket", "f", 0, &sz) == ncclxInvalidUsage);
  CHECK(ncclxConfigGetSize("net.socket", "g", 0, &sz) == ncclxInvalidUsage);
  CHECK(ncclxConfigGetSize("net.socket", "h", 0, &sz) == ncclxInvalidUsage);
  /* The parser every size key of the core and of our plugins uses (ncclx/config_value.h). */
  struct { const char* text; size_t want; } good[] = {
      {"0", 0}, {"64K", 64u << 10}, {"64 KiB", 64u << 10}, {"100B", 100}, {"2kb", 2048},
      {"4m", 4u << 20}, {"1G ", 1u << 30}, {" 4", 4}, {"\t8K\n", 8u << 10}, {"4KIB", 4u << 10},
      {"18446744073709551615", SIZE_MAX}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    sz = 7;
    CHECK(ncclxParseSize(good[i].text, &sz) == 0 && sz == good[i].want);
  }
  const char* bad[] = {"", " ", "-1", " -1", "+1", "4T", "4KK", "1Q", "K", "4 K x", "4Ki", "17179869184G", "4.5M"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    sz = 7;
    CHECK(ncclxParseSize(bad[i], &sz) == -1 && sz == 7);
  }
  int b = -1;
  const char* yes[] = {"true", "1", "YES", "On"};
  const char* no[] = {"false", "0", "no", "OFF"};
  for (int i = 0; i < 4; i++) {
    setenv("NCCLX_NET_SOCKET_FLAG", yes[i], 1);
    CHECK(ncclxConfigGetBool("net.socket", "flag", 0, &b) == ncclxSuccess && b == 1);
    setenv("NCCLX_NET_SOCKET_FLAG", no[i], 1);
    CHECK(ncclxConfigGetBool("net.socket", "flag", 1, &b) == ncclxSuccess && b == 0);
  }
  unsetenv("NCCLX_NET_SOCKET_FLAG");
}

/* First use from many threads at once: one load, everyone sees the same value. */
static void* concurrentGet(void* arg) {
  (void)arg;
  const char* v = ncclxConfigGet("core", "timeout_s");
  return (void*)(intptr_t)(v != NULL && strcmp(v, "77") == 0);
}

static void testConcurrentLoad(void) {
  useIni("threads.ini", "[core]\ntimeout_s = 77\n");
  pthread_t t[8];
  for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, concurrentGet, NULL);
  for (int i = 0; i < 8; i++) {
    void* ok = NULL;
    pthread_join(t[i], &ok);
    CHECK(ok == (void*)1);
  }
}

/* The source tree's config/ncclx.ini: argv[1], else $NCCLX_TEST_EXAMPLE_INI, else found through
 * the CMake cache of the build tree this executable sits in (<build>/tests/test_config). */
static int findShippedExample(const char* arg, char* out, size_t size) {
  const char* given = arg ? arg : getenv("NCCLX_TEST_EXAMPLE_INI");
  if (given != NULL) return snprintf(out, size, "%s", given), 1;
  char exe[512];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return 0;
  exe[n] = '\0';
  for (int up = 0; up < 3; up++) { /* <build>/tests/test_config -> <build> */
    char* slash = strrchr(exe, '/');
    if (slash == NULL) return 0;
    *slash = '\0';
    char cachePath[600];
    snprintf(cachePath, sizeof(cachePath), "%s/CMakeCache.txt", exe);
    FILE* f = fopen(cachePath, "r");
    if (f == NULL) continue;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
      const char* key = "CMAKE_HOME_DIRECTORY:INTERNAL=";
      if (strncmp(line, key, strlen(key)) != 0) continue;
      line[strcspn(line, "\r\n")] = '\0';
      int n = snprintf(out, size, "%s/config/ncclx.ini", line + strlen(key));
      found = n > 0 && (size_t)n < size;
    }
    fclose(f);
    return found;
  }
  return 0;
}

/* config/ncclx.ini from the source tree must load without a single warning. */
static void testShippedExample(const char* arg) {
  char example[700];
  if (!findShippedExample(arg, example, sizeof(example))) {
    printf("skipping the shipped example check: pass the path of config/ncclx.ini as argument "
           "or in NCCLX_TEST_EXAMPLE_INI\n");
    return;
  }
  printf("checking %s\n", example);
  CHECK(access(example, R_OK) == 0);
  setenv("NCCLX_CONF_FILE", example, 1);
  ncclxConfigReset();
  captureStart();
  ncclxResult_t res = ncclxConfigLoad();
  const char* log = captureEnd();
  CHECK(res == ncclxSuccess);
  CHECK(strstr(log, "WARN") == NULL);
  long l;
  int b;
  size_t sz;
  /* Its values are the documented defaults. */
  CHECK(ncclxConfigGetInt("core", "timeout_s", -1, 0, 100000000, &l) == ncclxSuccess && l == 600);
  CHECK(ncclxConfigGetBool("core", "lazy_connect", 0, &b) == ncclxSuccess && b == 1);
  CHECK(ncclxConfigGetSize("core", "chunk_bytes", 0, &sz) == ncclxSuccess && sz == 512u << 10);
  CHECK(ncclxConfigGetInt("net.socket", "nsocks", -1, 1, 16, &l) == ncclxSuccess && l == 2);
  CHECK(ncclxConfigGetSize("net.socket", "buffer_bytes", 0, &sz) == ncclxSuccess && sz == 4u << 20);
  CHECK(ncclxConfigGetSize("net.shm", "buffer_bytes", 0, &sz) == ncclxSuccess && sz == 1u << 20);
  CHECK(ncclxConfigGetInt("net.shm", "slots", -1, 4, 4096, &l) == ncclxSuccess && l == 16);
  CHECK(strcmp(ncclxConfigGet("tuner", "plugin"), "none") == 0);
}

int main(int argc, char** argv) {
  if (mkdtemp(tmpDir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  /* Variables from the caller's shell must not leak into the checks. */
  const char* clear[] = {"NCCLX_CORE_TIMEOUT_S", "NCCLX_CORE_LAZY_CONNECT", "NCCLX_CORE_CHUNK_BYTES",
                         "NCCLX_CORE_PLUGIN_PATH", "NCCLX_NET_PLUGIN", "NCCLX_NET_DEVICE",
                         "NCCLX_TUNER_PLUGIN", "NCCLX_PROFILER_PLUGIN", "NCCLX_DEBUG_LEVEL",
                         "NCCLX_NET_OFI_PROVIDER", "NCCLX_NET_SOCKET_NSOCKS",
                         "NCCLX_NET_SOCKET_BUFFER_BYTES"};
  for (size_t i = 0; i < sizeof(clear) / sizeof(clear[0]); i++) unsetenv(clear[i]);

  testGoodFile();
  testSyntaxError();
  testHostileFiles();
  testBadValues();
  testWarnings();
  testEnvOverride();
  testMissingFile();
  testSearchOrder();
  testSizes();
  testConcurrentLoad();
  testShippedExample(argc > 1 ? argv[1] : NULL);

  ncclxConfigReset();
  char cmd[700];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpDir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpDir);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("all config checks passed\n");
  return 0;
}
