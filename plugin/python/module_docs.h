// The docstrings of the _ftrun module (module.cc), kept apart from the
// binding code.
#pragma once

namespace ftrun::python {

constexpr const char kModuleDoc[] = R"doc(ftrun snapshot client (C++ extension).

Client connects to the node's ftrun agent and saves/loads a rank's tensors
through its shared memory. Blocking calls release the GIL; one Client may be
shared by threads (calls are serialized).

Errors: a failed ftrun call raises Error (a RuntimeError) whose .code is the
status code name ('NOT_FOUND', 'TIMEOUT', 'RESOURCE_EXHAUSTED', ...) and
.message the text; str(e) is 'CODE: message'. A code of INVALID_ARGUMENT
raises InvalidArgumentError, a subclass of both Error and ValueError.
Arguments the binding rejects itself (an object without the buffer protocol,
a non-contiguous buffer, an unknown dtype name) raise TypeError/ValueError.
)doc";

constexpr const char kSaveDoc[] = R"doc(
Snapshots `tensors` (dict name -> object with the buffer protocol: numpy
array, bytearray, memoryview) as `version`. Each buffer must be C-contiguous
and must not be modified until save returns. The dtype comes from the buffer
format ('e' float16, 'f' float32, 'd' float64, '?' bool, signed/unsigned
integers by item size). `dtypes` (dict name -> dtype name) overrides it for
types the buffer protocol cannot express, e.g. 'bfloat16' for a uint16 array
(or a uint8 array whose last dimension is twice as long). `generations`
(dict name -> int) are change hints: a non-zero value equal to the one given
at the previous save promises the tensor did not change, so it is not read.
CUDA memory: a value with __cuda_array_interface__ (a contiguous torch CUDA
tensor, CuPy array; bfloat16 or float8 as a uint8 view with a `dtypes`
override) is saved from the device without host staging: chunk
fingerprints are computed on the GPU, only changed chunks are copied, and
save returns once the copies are queued. `cuda_stream` (an int
cudaStream_t, e.g. torch.cuda.current_stream().cuda_stream; 0: the default
streams) is the stream that wrote the tensors: the copies wait for its
earlier work, and its later work waits for the copies (the CPU does not);
order_cuda_stream=False leaves that wait to order_after_save(), so the
copies overlap the stream's next work.
The memory must stay allocated until wait() or the next save.
same_buffers (None or a set of names): the entries named are objects the
caller keeps and never changes (memory, shape, format); the client keeps
them and what it read from them, and an entry given as the very object it
was at the last save (same name and dtype) is not read again (ftrun.save
names the views it keeps of a state's own tensors). None, or a load, drops them.
Returns the save statistics as a dict (bytes_total, bytes_hashed,
bytes_copied, chunks_total, chunks_copied, chunks_skipped, chunks_unchanged,
stall_seconds). RESOURCE_EXHAUSTED: the store cannot fit this save; the last
committed version is kept.
)doc";

constexpr const char kLoadDoc[] = R"doc(
Opens `version` (None: the last committed one), reads every tensor into a
new numpy array of its saved dtype and shape (checking chunk hashes) and
returns a LoadResult, which unpacks as

    version, tensors, user_bytes = client.load()

numpy has no bfloat16: such tensors come back as uint16 arrays of the same
shape, and the result's .dtypes dict (name -> saved dtype name) says which,
e.g. torch.from_numpy(a).view(torch.bfloat16) when .dtypes[name] ==
'bfloat16'. .devices (name -> 'cpu' or 'cuda') tells where each was saved
from; the arrays are in host memory, except those named in `cuda`.

cuda (dict name -> CUDA memory with __cuda_array_interface__, contiguous,
of the saved size; or a callable given the version's user bytes that
returns such a dict) puts those tensors straight into that memory: hashes are
checked on the host, then the bytes go from the store to the device
asynchronously on `cuda_stream` (0: the legacy default stream); the result
holds the given objects for them. Work queued on that stream afterwards
sees the bytes.

into (the same, for host memory: a dict name -> writable C-contiguous
buffer of the saved size, e.g. t.view(-1).view(torch.uint8).numpy() of a
contiguous CPU tensor t; or a callable) puts those tensors straight into
that memory, nothing allocated or mapped: a chunk the memory already holds
(its bytes hash to the saved hash) is left as it is, the others are copied
from the store and hashed as they are copied. A corrupted chunk raises, and
the memory then holds the chunks before it. The result holds the given objects for them.

map=True maps every tensor of 64 KiB or more copy-on-write from the agent's
shared memory instead of copying it (hashes are still checked): the load
costs page-table updates, not a copy into fresh memory. Writing to such an
array gives this process a private copy of the page written; the agent's
copy never changes. While such arrays are alive the version stays pinned in
the store; the next save first makes their remaining pages private (a copy),
so drop them once their contents are put back (e.g. after load_state_dict).
)doc";

}  // namespace ftrun::python
