/* Compiles include/ftrun/ftrun.h as C (the test target builds this file as a
 * C object) and exercises its types from C. c_api_test.cc calls
 * ftrun_c_header_check() and expects 0. */
#include <stddef.h>
#include <stdint.h>

#include "ftrun/ftrun.h"

int ftrun_c_header_check(void);

int ftrun_c_header_check(void) {
  ftrun_client_t* client = NULL;
  ftrun_snapshot_t* snap = NULL;
  ftrun_client_options_t options = {0};
  int64_t shape[2] = {2, 3};
  float data[6] = {0};
  ftrun_tensor_t tensor = {0};
  ftrun_save_stats_t stats = {0};
  char* err = NULL;
  uint64_t version = 0;
  uint64_t versions[4];
  size_t n = 0;
  int failures = 0;

  options.field_mask = FTRUN_CLIENT_FIELD_RANK | FTRUN_CLIENT_FIELD_CONNECT_TIMEOUT;
  options.rank = 0;
  options.connect_timeout_ms = 100;

  tensor.field_mask = FTRUN_TENSOR_FIELD_GENERATION | FTRUN_TENSOR_FIELD_DEVICE;
  tensor.name = "layer.0.weight";
  tensor.dtype = FTRUN_DTYPE_FLOAT32;
  tensor.ndim = 2;
  tensor.shape = shape;
  tensor.data = data;
  tensor.nbytes = sizeof(data);
  tensor.device = FTRUN_DEVICE_HOST;
  tensor.generation = 1;
  stats.field_mask = FTRUN_SAVE_STATS_FIELD_ALL;

  /* No agent here: only the argument checks can be exercised. */
  if (ftrun_client_connect_opts(&options, NULL, &err) != FTRUN_INVALID_ARGUMENT) ++failures;
  if (ftrun_save(client, 1, &tensor, 1, "", 0, &stats, &err) != FTRUN_INVALID_ARGUMENT) {
    ++failures;
  }
  if (err == NULL) ++failures;
  if (ftrun_load(client, FTRUN_LATEST, &snap, &err) != FTRUN_INVALID_ARGUMENT) ++failures;
  if (snap != NULL) ++failures;
  if (ftrun_list_versions(client, versions, 4, &n, &err) != FTRUN_INVALID_ARGUMENT) ++failures;
  if (ftrun_wait(client, NULL) != FTRUN_INVALID_ARGUMENT) ++failures;
  if (ftrun_client_restore_version(client, &version) != 0) ++failures;
  if (ftrun_snapshot_num_tensors(snap) != 0) ++failures;
  ftrun_free(err);
  ftrun_snapshot_close(snap);
  ftrun_client_close(client);
  return failures;
}
