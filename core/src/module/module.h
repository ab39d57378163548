/* Feature modules (ncclx/module.h): loaded at communicator init from [modules] in ncclx.ini, each
 * implementing a family of public calls that libncclx forwards to it. */
#ifndef NCCLX_MODULE_INTERNAL_H
#define NCCLX_MODULE_INTERNAL_H

#include <stdint.h>

#include "ncclx/module.h"

struct ncclxComm;

/* Modules known to the core: their [modules] key, default file and family. */
typedef enum { MODULE_COMMFUSE = 0, MODULE_MOE, MODULE_COUNT } moduleId;

/* The family table of module id (loading it on first use), or NULL with this thread's error
 * set, naming fn, the module and its [modules] key (disabled, missing, refused). */
const void* moduleFamily(moduleId id, const char* fn);
/* Without an error: NULL when the module is not (or cannot be) loaded. */
const void* moduleFamilyQuiet(moduleId id);

/* The core's side of the ABI (module_core.c). */
const ncclxModuleCore_v1_t* moduleCoreTable(void);
/* Messages and waiting (module_msg.c), as the table's msgSend ... waitCheck describe them. */
ncclxResult_t moduleMsgSend(ncclxComm_t comm, int peer, const void* buf, size_t bytes, void** req);
ncclxResult_t moduleMsgRecv(ncclxComm_t comm, int peer, void* buf, size_t bytes, void** req);
ncclxResult_t moduleMsgTest(ncclxComm_t comm, int peer, void* req, int* done, size_t* got);
ncclxResult_t moduleLinkFailed(ncclxComm_t comm, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
unsigned moduleSpinPolls(ncclxComm_t comm);
void moduleWaitPeers(ncclxComm_t comm, const int* peers, const int* isSend, int n);
ncclxResult_t moduleWaitCheck(ncclxComm_t comm, const int* awaited, int nAwaited, double waitedSec,
                              const char* waitingOn);
/* The [modules] settings as a hash every rank compares at init (ranks that load different
 * modules would run different steps), and as text ("commfuse = on") for the error. */
uint64_t moduleConfigHash(void);
void moduleConfigDescribe(char* buf, size_t size);
/* A communicator goes: hand each module its state (module_loader.c). */
void moduleCommDestroy(struct ncclxComm* comm);

#endif
