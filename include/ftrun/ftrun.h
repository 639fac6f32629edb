/* ftrun C API: a stable C ABI over ftrun::Client (include/ftrun/client.h),
 * in the style of LevelDB's include/leveldb/c.h. Plain C99; usable from C++.
 *
 * Conventions
 *  - Handles (ftrun_client_t, ftrun_snapshot_t) are opaque. Create them with
 *    ftrun_client_connect / ftrun_load, destroy them with ftrun_client_close
 *    / ftrun_snapshot_close. Both close functions accept NULL.
 *  - Functions that can fail take `char** errptr` as their last argument and
 *    return 0 on success or the positive ftrun::Code value of the failure
 *    (FTRUN_INVALID_ARGUMENT, FTRUN_UNAVAILABLE, ... below).
 *    *errptr must be NULL or a message from an earlier call. On failure the
 *    earlier message is freed and *errptr is set to a new malloc'd,
 *    NUL-terminated message "CODE_NAME: text", which the caller frees with
 *    ftrun_free. On success *errptr is left as it was. errptr itself may be
 *    NULL when the caller only wants the return code.
 *  - A NULL handle or a NULL required pointer gives FTRUN_INVALID_ARGUMENT
 *    with a message naming the argument; nothing aborts, nothing throws, and
 *    the library never calls exit().
 *  - Ownership: the caller owns every buffer it passes in and every handle
 *    it gets back. Pointers returned *into* a handle (ftrun_client_job_id,
 *    ftrun_snapshot_tensor_info, ftrun_snapshot_user_bytes) are valid until
 *    that handle is closed. Tensor data passed to ftrun_save must stay valid
 *    and unmodified until ftrun_save returns (host memory) or until
 *    ftrun_wait / the next ftrun_save (CUDA memory).
 *  - A snapshot keeps its client's connection alive: closing the client
 *    while snapshots are open is allowed, the connection ends when the last
 *    of them is closed.
 *  - Thread-safety: a client and its snapshots are used by one thread at a
 *    time; calls from several threads must be serialized by the caller.
 */
#ifndef FTRUN_FTRUN_H_
#define FTRUN_FTRUN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes: the values of ftrun::Code (include/ftrun/status.h). */
enum {
  FTRUN_OK = 0,
  FTRUN_INVALID_ARGUMENT = 1,
  FTRUN_NOT_FOUND = 2,
  FTRUN_ALREADY_EXISTS = 3,
  FTRUN_RESOURCE_EXHAUSTED = 4,
  FTRUN_FAILED_PRECONDITION = 5,
  FTRUN_IO_ERROR = 6,
  FTRUN_CORRUPTION = 7,
  FTRUN_UNAVAILABLE = 8,
  FTRUN_TIMEOUT = 9,
  FTRUN_UNIMPLEMENTED = 10,
  FTRUN_CHUNK_MISSING = 11,
  FTRUN_IO_TRANSIENT = 12
};

/* Element types: the values of ftrun::DType. */
enum {
  FTRUN_DTYPE_UINT8 = 0,
  FTRUN_DTYPE_INT8 = 1,
  FTRUN_DTYPE_INT16 = 2,
  FTRUN_DTYPE_INT32 = 3,
  FTRUN_DTYPE_INT64 = 4,
  FTRUN_DTYPE_FLOAT16 = 5,
  FTRUN_DTYPE_BFLOAT16 = 6,
  FTRUN_DTYPE_FLOAT32 = 7,
  FTRUN_DTYPE_FLOAT64 = 8,
  FTRUN_DTYPE_BOOL = 9,
  FTRUN_DTYPE_UINT16 = 10,
  FTRUN_DTYPE_UINT32 = 11,
  FTRUN_DTYPE_UINT64 = 12
};

/* Devices: the values of ftrun::Device. */
enum { FTRUN_DEVICE_HOST = 0, FTRUN_DEVICE_CUDA = 1 };

/* ftrun_load's version for "the last committed version". */
#define FTRUN_LATEST (~(uint64_t)0)

typedef struct ftrun_client_t ftrun_client_t;
typedef struct ftrun_snapshot_t ftrun_snapshot_t;

/* ---- Connecting ---------------------------------------------------------- */

/* Bits of ftrun_client_options_t.field_mask: which optional fields are set. */
enum {
  FTRUN_CLIENT_FIELD_SOCKET_PATH = 1u << 0,
  FTRUN_CLIENT_FIELD_RANK = 1u << 1,
  FTRUN_CLIENT_FIELD_CONNECT_TIMEOUT = 1u << 2
};

/* Options for ftrun_client_connect_opts. Fields whose bit is clear in
 * field_mask are ignored and take their defaults, so the struct can grow. */
typedef struct ftrun_client_options_t {
  uint64_t field_mask;
  const char* socket_path; /* default / NULL: $FTRUN_AGENT_SOCKET */
  int rank;                /* default / -1: $FTRUN_RANK, else $RANK */
  int connect_timeout_ms;  /* default: 10000 */
} ftrun_client_options_t;

/* Connects to the node agent. socket_path NULL: $FTRUN_AGENT_SOCKET; rank -1:
 * $FTRUN_RANK, else $RANK. On success *out is a new client; on failure *out
 * is set to NULL. */
int ftrun_client_connect(const char* socket_path, int rank, ftrun_client_t** out, char** errptr);
/* Same, with every option spelled out; options may be NULL (all defaults). */
int ftrun_client_connect_opts(const ftrun_client_options_t* options, ftrun_client_t** out, char** errptr);
void ftrun_client_close(ftrun_client_t* client);

/* Accessors. On a NULL client: -1, NULL and 0 respectively. */
int ftrun_client_rank(const ftrun_client_t* client);
const char* ftrun_client_job_id(const ftrun_client_t* client);
uint64_t ftrun_client_chunk_size(const ftrun_client_t* client);
/* 1 and *version set when this rank must restore *version after a restart;
 * 0 at a fresh start (or on a NULL argument). */
int ftrun_client_restore_version(const ftrun_client_t* client, uint64_t* version);

/* ---- Saving -------------------------------------------------------------- */

/* Bits of ftrun_tensor_t.field_mask: which optional fields are set. */
enum { FTRUN_TENSOR_FIELD_GENERATION = 1u << 0, FTRUN_TENSOR_FIELD_DEVICE = 1u << 1 };

/* One named, contiguous tensor to save. name, dtype, ndim, shape, data and
 * nbytes are required; nbytes must equal product(shape) * size of dtype.
 * generation (default 0, "unknown") is a change hint: a non-zero value equal
 * to the one given for this tensor at the previous save promises the bytes
 * did not change. device defaults to FTRUN_DEVICE_HOST. */
typedef struct ftrun_tensor_t {
  uint64_t field_mask;
  const char* name;     /* NUL-terminated */
  int dtype;            /* FTRUN_DTYPE_* */
  int ndim;             /* >= 0; shape may be NULL when 0 */
  const int64_t* shape; /* ndim entries */
  const void* data;
  uint64_t nbytes;
  int device;          /* FTRUN_TENSOR_FIELD_DEVICE: FTRUN_DEVICE_* */
  uint64_t generation; /* FTRUN_TENSOR_FIELD_GENERATION */
} ftrun_tensor_t;

/* Bits of ftrun_save_stats_t.field_mask: the caller sets the fields it wants
 * filled in (UCX attr style), so the struct can grow. */
enum {
  FTRUN_SAVE_STATS_FIELD_BYTES_TOTAL = 1u << 0,
  FTRUN_SAVE_STATS_FIELD_BYTES_HASHED = 1u << 1,
  FTRUN_SAVE_STATS_FIELD_BYTES_COPIED = 1u << 2,
  FTRUN_SAVE_STATS_FIELD_CHUNKS_TOTAL = 1u << 3,
  FTRUN_SAVE_STATS_FIELD_CHUNKS_COPIED = 1u << 4,
  FTRUN_SAVE_STATS_FIELD_CHUNKS_SKIPPED = 1u << 5,
  FTRUN_SAVE_STATS_FIELD_CHUNKS_UNCHANGED = 1u << 6,
  FTRUN_SAVE_STATS_FIELD_STALL_SECONDS = 1u << 7,
  FTRUN_SAVE_STATS_FIELD_ALL = (1u << 8) - 1u
};

/* What a save did; see ftrun::SaveStats. */
typedef struct ftrun_save_stats_t {
  uint64_t field_mask; /* in: FTRUN_SAVE_STATS_FIELD_* wanted */
  uint64_t bytes_total;
  uint64_t bytes_hashed;
  uint64_t bytes_copied;
  uint64_t chunks_total;
  uint64_t chunks_copied;
  uint64_t chunks_skipped;
  uint64_t chunks_unchanged;
  double stall_seconds;
} ftrun_save_stats_t;

/* Snapshots tensors[0..n) as `version`, which must be greater than this
 * rank's last saved version; the tensor set, dtypes and shapes must be the
 * same at every save. user_bytes (may be NULL when user_len is 0) are stored
 * with the version and returned by ftrun_snapshot_user_bytes. stats may be
 * NULL. FTRUN_RESOURCE_EXHAUSTED: the store cannot fit this save; the last
 * committed version is kept and the caller may go on. */
int ftrun_save(ftrun_client_t* client, uint64_t version, const ftrun_tensor_t* tensors, size_t n,
               const void* user_bytes, size_t user_len, ftrun_save_stats_t* stats, char** errptr);
/* Completes the last save's asynchronous part (CUDA copies, manifest). */
int ftrun_wait(ftrun_client_t* client, char** errptr);
/* Blocks until `version` (or a newer one) is committed by every rank, up to
 * timeout_ms: FTRUN_TIMEOUT after that. */
int ftrun_wait_committed(ftrun_client_t* client, uint64_t version, int timeout_ms, char** errptr);
/* Tells the agent the rank is alive and at `step` (hang detection). */
int ftrun_report_progress(ftrun_client_t* client, uint64_t step, char** errptr);
/* Sets *n to the number of committed versions and writes the first
 * min(cap, *n) of them, ascending, to committed (which may be NULL when cap
 * is 0: call with cap 0 to size a buffer). */
int ftrun_list_versions(ftrun_client_t* client, uint64_t* committed, size_t cap, size_t* n, char** errptr);

/* ---- Loading ------------------------------------------------------------- */

/* Opens `version` (FTRUN_LATEST: the last committed one) for reading. The
 * version stays pinned in the store until the snapshot is closed. On failure
 * *out is set to NULL. */
int ftrun_load(ftrun_client_t* client, uint64_t version, ftrun_snapshot_t** out, char** errptr);
/* 0 on a NULL snapshot. */
uint64_t ftrun_snapshot_version(const ftrun_snapshot_t* snap);
size_t ftrun_snapshot_num_tensors(const ftrun_snapshot_t* snap);
/* Describes tensor i (0 <= i < num_tensors). Any output pointer may be NULL.
 * *name and *shape point into snap and stay valid while it is open.
 * Returns 0, or FTRUN_INVALID_ARGUMENT for a NULL snap or i out of range. */
int ftrun_snapshot_tensor_info(const ftrun_snapshot_t* snap, size_t i, const char** name, int* dtype, int* ndim,
                               const int64_t** shape, uint64_t* nbytes);
/* *data (valid while snap is open) and *len of the version's user bytes. */
void ftrun_snapshot_user_bytes(const ftrun_snapshot_t* snap, const void** data, size_t* len);
/* Copies tensor `name` into host memory dst; nbytes must equal its size.
 * FTRUN_CORRUPTION when a chunk does not match its hash. */
int ftrun_snapshot_read(const ftrun_snapshot_t* snap, const char* name, void* dst, uint64_t nbytes, char** errptr);
void ftrun_snapshot_close(ftrun_snapshot_t* snap);

/* ---- Misc ---------------------------------------------------------------- */

/* "INVALID_ARGUMENT", ... for a return code; static storage. */
const char* ftrun_code_name(int code);
/* Frees a message from errptr (or any pointer this API says to free).
 * NULL is fine. */
void ftrun_free(void* ptr);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FTRUN_FTRUN_H_ */
