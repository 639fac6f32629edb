"""The persist directory as ftrun writes it (plugin/persist/disk_format.h),
read the way the disk faults and the verdict need: the complete versions,
a chunk's file, the chunks a manifest references."""
import glob
import os
import struct

CHUNK_HEADER = 4096  # plugin/persist/disk_format.h: a chunk file's bytes start here


def complete_versions(persist_dir, job_id, nodes):
    """Version directories whose every node marker is there, oldest first."""
    out = []
    for d in sorted(glob.glob(os.path.join(persist_dir, job_id, "v" + "[0-9]" * 20))):
        if all(os.path.exists(os.path.join(d, "node%d.COMPLETE" % n)) for n in range(nodes)):
            out.append(d)
    return out


def chunk_path(persist_dir, job_id, hash_hex):
    return os.path.join(persist_dir, job_id, "chunks", hash_hex[:2], hash_hex)


def manifest_chunks(path):
    """The chunk hashes (hex, high half first, as file names are) a manifest file references."""
    with open(path, "rb") as f:
        data = f.read()
    base = os.path.dirname(os.path.dirname(path))
    out = []
    for sub in glob.glob(os.path.join(base, "chunks", "*", "*")):
        name = os.path.basename(sub)
        if len(name) == 32 and struct.pack("<QQ", int(name[16:], 16), int(name[:16], 16)) in data:
            out.append(name)
    return out
