/* A rank written against the C ABI only (include/ftrun/ftrun.h), run under
 * ftrun-agent by test_c_client.py. Saves three versions, waits for their
 * commit, loads the latest back and compares bytes; checks the error
 * conventions on a version that goes backwards. Prints "C CLIENT OK". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ftrun/ftrun.h"

#define FAIL(...)                              \
  do {                                         \
    fprintf(stderr, "c_client: " __VA_ARGS__); \
    fprintf(stderr, "\n");                     \
    return 1;                                  \
  } while (0)

int main(void) {
  char* err = NULL;
  ftrun_client_t* c = NULL;
  if (ftrun_client_connect(NULL, -1, &c, &err) != 0) FAIL("connect: %s", err);
  int rank = ftrun_client_rank(c);
  enum { N = 300000 };
  float* w = malloc(N * sizeof(float));
  int64_t steps[1] = {0};
  for (int i = 0; i < N; ++i) w[i] = (float)(i * (rank + 1));
  int64_t shape[1] = {N}, one[1] = {1};
  for (uint64_t v = 1; v <= 3; ++v) {
    w[v * 1000] += 1.0f;
    steps[0] = (int64_t)v;
    ftrun_tensor_t t[2];
    memset(t, 0, sizeof(t));
    t[0].name = "w";
    t[0].dtype = FTRUN_DTYPE_FLOAT32;
    t[0].ndim = 1;
    t[0].shape = shape;
    t[0].data = w;
    t[0].nbytes = N * sizeof(float);
    t[1].name = "step";
    t[1].dtype = FTRUN_DTYPE_INT64;
    t[1].ndim = 1;
    t[1].shape = one;
    t[1].data = steps;
    t[1].nbytes = sizeof(int64_t);
    ftrun_save_stats_t st;
    memset(&st, 0, sizeof(st));
    st.field_mask = FTRUN_SAVE_STATS_FIELD_ALL;
    if (ftrun_save(c, v, t, 2, "user", 4, &st, &err) != 0) FAIL("save %llu: %s", (unsigned long long)v, err);
    if (v > 1 && st.bytes_copied >= st.bytes_total) FAIL("save %llu copied everything", (unsigned long long)v);
    if (v == 3) {
      /* Going backwards is refused, with a message, and loses nothing. */
      int code = ftrun_save(c, 2, t, 2, NULL, 0, NULL, &err);
      if (code != FTRUN_FAILED_PRECONDITION || err == NULL || strstr(err, "versions must increase") == NULL)
        FAIL("backwards version: code %d, message %s", code, err ? err : "(none)");
    }
  }
  if (ftrun_wait_committed(c, 3, 30000, &err) != 0) FAIL("wait_committed: %s", err);
  uint64_t versions[8];
  size_t n = 0;
  if (ftrun_list_versions(c, versions, 8, &n, &err) != 0 || n == 0 || versions[n - 1] != 3)
    FAIL("list_versions: n=%zu %s", n, err ? err : "");
  ftrun_snapshot_t* s = NULL;
  if (ftrun_load(c, FTRUN_LATEST, &s, &err) != 0) FAIL("load: %s", err);
  if (ftrun_snapshot_version(s) != 3 || ftrun_snapshot_num_tensors(s) != 2) FAIL("snapshot shape");
  float* back = malloc(N * sizeof(float));
  if (ftrun_snapshot_read(s, "w", back, N * sizeof(float), &err) != 0) FAIL("read: %s", err);
  if (memcmp(back, w, N * sizeof(float)) != 0) FAIL("restored bytes differ");
  const void* ub;
  size_t ul;
  ftrun_snapshot_user_bytes(s, &ub, &ul);
  if (ul != 4 || memcmp(ub, "user", 4) != 0) FAIL("user bytes differ");
  if (ftrun_snapshot_read(s, "nope", back, 4, &err) != FTRUN_NOT_FOUND) FAIL("missing tensor not reported");
  ftrun_snapshot_close(s);
  ftrun_free(err);
  ftrun_client_close(c);
  free(w);
  free(back);
  printf("C CLIENT OK %d\n", rank);
  return 0;
}
