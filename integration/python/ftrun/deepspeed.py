"""ftrun.deepspeed: DeepSpeed checkpoints kept in the ftrun agent's memory.

After deepspeed.initialize, one line switches DeepSpeed's checkpoint engine::

    engine, optimizer, _, _ = deepspeed.initialize(...)
    ftrun.deepspeed.install(engine)
    ...
    engine.save_checkpoint(save_dir)        # into the agent's RAM, placeholders on disk
    engine.load_checkpoint(save_dir)        # after a restart: back out of RAM

Assumptions about DeepSpeed (read from its sources, 0.16 to 0.19; DeepSpeed is
never imported here, the engine is duck-typed):

* DeepSpeed >= 0.17.1 calls CheckpointEngine.create(info) and commit(info)
  with a CheckpointCommitInfo (attributes tag, save_dir, save_latest; save_dir
  is the directory that holds the tag directories). DeepSpeed <= 0.16 passes
  the tag string instead; save_dir is then taken from the saved paths, which
  are always <save_dir>/<tag>/<file>.
* Engine.save_checkpoint calls create, then save(state_dict, path) once per
  file (mp_rank_XX_model_states.pt, [bf16_]zero_pp_rank_D_mp_rank_XX_
  optim_states.pt, expert and layer files), then commit (not when
  is_decoupled() is True; this engine is not decoupled), then writes
  <save_dir>/latest itself on global rank 0 when save_latest. It does not
  change the saved tensors between save and commit (save_checkpoint is
  synchronous): save() pickles the structure and queues the copies of CUDA
  tensors at once, but CPU tensors are only referenced (no copy) and read by
  commit.
* Engine.load_checkpoint reads <save_dir>/latest, globs <tag>/*model_states.pt,
  checks os.path.exists of the zero_pp_rank_* files, then calls
  load(path, map_location) per file, with map_location 'cpu', a
  torch.device, or the identity callable `lambda storage, loc: storage`.
* The engine decides which data-parallel ranks save the model states through
  is_data_parallel_writer(dp_rank) when it is built (save_non_zero_checkpoint),
  but every rank loads them. Each ftrun rank only reads its own snapshots, so
  this engine answers True for every rank and install() sets
  engine.save_non_zero_checkpoint = True (the node store deduplicates the
  identical chunks of ranks on one node). Cross-rank loads (ZeRO elastic
  checkpoints, pipeline layer files written by data-parallel rank 0 only) are
  not served: load raises FileNotFoundError naming the file.
* preserves_storage_sharing() is False: ftrun stores each tensor's own bytes,
  so DeepSpeed need not clone tensors before save (no copy, no bloat).

How tags map to ftrun versions: one tag is one ftrun version of each rank,
holding all files the rank saved for it. A tag's trailing digits are its
version ("global_step100" -> 100); a tag without digits, or whose number is
not above the rank's last version, takes the last version + 1 (the same on
every rank, since ranks save the same tag sequence). The mapping is recorded
in engine.tag_versions, in the version's own metadata (tag, files), and in
each placeholder file (tag, version, file), so a restarted process finds it
on disk. commit writes the rank's placeholders, saves, and waits until
every rank has saved the version (it is committed) before it writes `latest`,
so `latest` never names a tag the agent cannot restore, nor one whose
placeholders a rank lacks (a rank killed between its save and the commit
wrote them before its save). A placeholder of a tag that never committed
names a version the agent does not hold: loading it says so. The agent keeps
only the last committed version: older tags cannot be loaded from RAM.

Placeholders are a few hundred bytes of text starting with "ftrun placeholder"
(torch.load refuses them). A path that holds a real torch file (not a
placeholder) is loaded with torch.load, so a run can start from an ordinary
checkpoint on disk. Tools that read checkpoint files directly, without the
engine (zero_to_fp32.py, universal checkpoints, NVMe offload folders), see
only placeholders.

Limits: every rank must save the same files with the same tensor shapes at
every tag (the store keeps one layout per rank: e.g. a torch optimizer without
ZeRO has no state before its first step, so checkpoint after it); every rank
must call save_checkpoint for a tag to commit (commit waits commit_timeout
seconds, then raises ftrun.Error TIMEOUT). Do not mix this engine with
ftrun.save in one rank: they share the rank's version sequence and layout.
"""

import json
import os
import re
import socket
import warnings

from . import _ftrun
from . import state as _state

__all__ = ["FtrunCheckpointEngine", "install", "read_placeholder", "PLACEHOLDER_MAGIC"]

PLACEHOLDER_MAGIC = b"ftrun placeholder"
_FORMAT = "ftrun.deepspeed"
_FORMAT_VERSION = 1
_TRAILING_DIGITS = re.compile(r"(\d+)$")


def _info_fields(info):
    """(tag, save_dir or None, save_latest or None) of a CheckpointCommitInfo or a tag string."""
    if isinstance(info, (str, bytes, int)):
        return str(info), None, None
    tag = getattr(info, "tag", None)
    if tag is None:
        raise TypeError(f"ftrun.deepspeed: expected a tag string or an object with .tag, got {type(info).__name__}")
    save_dir = getattr(info, "save_dir", None)
    return str(tag), (os.path.abspath(save_dir) if save_dir else None), getattr(info, "save_latest", None)


def _atomic_write(path, data):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.ftrun-tmp-{socket.gethostname()}-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_placeholder(path):
    """The placeholder's record (dict with tag, version, file) or None when
    path is missing or is not an ftrun placeholder."""
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError:
        return None
    if not head.startswith(PLACEHOLDER_MAGIC):
        return None
    for line in reversed(head.decode("utf-8", "replace").splitlines()):
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                return None
            if rec.get("ftrun_placeholder") and "version" in rec and "file" in rec:
                return rec
    return None


def _placeholder_bytes(tag, version, key):
    rec = json.dumps({"ftrun_placeholder": 1, "tag": tag, "version": version, "file": key}, sort_keys=True)
    return (PLACEHOLDER_MAGIC + b": not a torch checkpoint.\n"
            b"DeepSpeed saved this file through ftrun.deepspeed.FtrunCheckpointEngine: its contents\n"
            b"live in the ftrun agent's memory (this version of every rank). Load it through that engine.\n"
            + rec.encode() + b"\n")


class _Pending:
    """The files saved for one tag, until commit."""

    def __init__(self, tag, save_dir, save_latest, new_style):
        self.tag = tag
        self.save_dir = save_dir
        self.save_latest = save_latest
        self.new_style = new_style
        self.packer = _state._Packer()
        self.entries = {}      # key -> state_dict, in first-save order
        self.skeletons = {}    # key -> skeleton pickle
        self.paths = {}        # key -> absolute path
        self.repack = False

    def tag_dir(self, path):
        if self.save_dir is None:
            # DeepSpeed <= 0.16: paths are <save_dir>/<tag>/<file>; find the tag component.
            parts = path.split(os.sep)
            for i in range(len(parts) - 2, 0, -1):
                if parts[i] == self.tag:
                    self.save_dir = os.sep.join(parts[:i]) or os.sep
                    break
            else:
                return os.path.dirname(path)
        return os.path.join(self.save_dir, self.tag)

    def key_for(self, path):
        rel = os.path.relpath(path, self.tag_dir(path))
        return path if rel.startswith("..") else rel


class FtrunCheckpointEngine:
    """A DeepSpeed CheckpointEngine that keeps every rank's checkpoint in its
    node's ftrun agent (see the module docstring for the contract).

    config_params: accepted for DeepSpeed's signature, unused. client: an
    ftrun.Client (default: the one ftrun.state connects lazily).
    commit_timeout: seconds commit waits for every rank to save the tag.
    """

    def __init__(self, config_params=None, *, client=None, commit_timeout=600.0):
        self.name = "ftrun"
        self.config_params = config_params
        self.commit_timeout = commit_timeout
        self.tag_versions = {}     # tag -> ftrun version, for tags saved or loaded here
        self._client = client
        self._pending = None
        self._last_version = None  # this rank's last saved version (from the agent at first use)
        self._loaded = None        # (version, _state._Loaded, keys not yet served)

    # -- helpers ---------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            self._client = _state.get_client()
        return self._client

    def _version_for(self, tag):
        if self._last_version is None:
            lv = self.client.list_versions()
            known = list(lv["committed"]) + list(lv["pending"])
            self._last_version = max(known) if known else -1
        m = _TRAILING_DIGITS.search(tag)
        version = int(m.group(1)) if m else None
        if version is not None and version >= 1 << 63:
            version = None  # not a usable version number
        if version is None or version <= self._last_version:
            fallback = max(self._last_version + 1, 1)
            if version is not None:
                _state._warn_once(("tag", tag), f"ftrun.deepspeed: tag '{tag}' is not above the last version "
                                  f"{self._last_version}; it becomes version {fallback}")
            version = fallback
        return version

    def _start(self, info):
        tag, save_dir, save_latest = _info_fields(info)
        self._pending = _Pending(tag, save_dir, save_latest, new_style=not isinstance(info, (str, bytes, int)))
        self._loaded = None  # a save starts: drop what a load kept
        return self._pending

    # -- DeepSpeed's CheckpointEngine interface --------------------------

    def create(self, info):
        """Starts the checkpoint `info` (CheckpointCommitInfo, or a tag string in DeepSpeed <= 0.16)."""
        self._start(info)

    def makedirs(self, path, exist_ok=False):
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path):
        """Collects one file of the current tag; nothing reaches ftrun before commit."""
        path = os.path.abspath(path)
        p = self._pending
        if p is None:
            tag = os.path.basename(os.path.dirname(path))
            warnings.warn(f"ftrun.deepspeed: save({path!r}) without create(); assuming tag '{tag}'",
                          RuntimeWarning, stacklevel=2)
            p = self._start(tag)
        key = p.key_for(path)
        if key in p.entries:
            p.repack = True  # the same file again: it replaces the first, packed anew at commit
        else:
            p.skeletons[key] = p.packer.pack(state_dict, "deepspeed/" + key)
        p.entries[key] = state_dict
        p.paths[key] = path
        return None

    def commit(self, info):
        """Saves the tag's files as one ftrun version, waits until every rank
        has it, then writes the placeholders (and `latest`, for DeepSpeed >=
        0.17 when info.save_latest). Returns True."""
        tag, save_dir, save_latest = _info_fields(info)
        p = self._pending
        if p is None or p.tag != tag:
            if p is not None and p.entries:
                raise RuntimeError(f"ftrun.deepspeed: commit of tag '{tag}' while tag '{p.tag}' is open")
            p = self._start(info)  # nothing saved by this rank: still save, so the version commits
        if save_dir is not None:
            p.save_dir = save_dir
        if p.repack:
            p.packer = _state._Packer()
            p.skeletons = {k: p.packer.pack(sd, "deepspeed/" + k) for k, sd in p.entries.items()}
        version = self._version_for(tag)
        payload = {"format": _FORMAT, "format_version": _FORMAT_VERSION, "tag": tag, "files": p.skeletons,
                   "save_dir": p.save_dir}
        # The placeholders before the save: once the version is committed (every rank saved it) and a rank
        # writes `latest`, every rank's placeholders are there, even a rank killed right after its save.
        for key, path in p.paths.items():
            _atomic_write(path, _placeholder_bytes(tag, version, key))
        p.packer.save(self.client, version, payload)
        self._last_version = version
        self.tag_versions[tag] = version
        self._pending = None
        if self.commit_timeout:
            self.client.wait_committed(version, timeout_ms=int(self.commit_timeout * 1000))
        if p.new_style and save_latest and p.save_dir is not None:
            _atomic_write(os.path.join(p.save_dir, "latest"), tag.encode())
        return True

    def load(self, path, map_location=None):
        """The state saved at `path` (a placeholder: out of ftrun; a real
        torch file: torch.load). map_location as in torch.load (see
        ftrun.load); DeepSpeed's identity callable leaves tensors on the CPU."""
        path = os.path.abspath(path)
        rec = read_placeholder(path)
        if rec is None:
            if os.path.isfile(path):
                return _torch_load(path, map_location)
            tag, key = os.path.basename(os.path.dirname(path)), os.path.basename(path)
            version = self.tag_versions.get(tag)
            if version is None:
                raise FileNotFoundError(f"ftrun.deepspeed: no checkpoint file or ftrun placeholder at {path}")
        else:
            tag, key, version = rec.get("tag"), rec["file"], int(rec["version"])
        loaded = self._version(version, tag, path)
        files = loaded.payload["files"]
        if key not in files:
            raise FileNotFoundError(
                f"ftrun.deepspeed: rank {self.client.rank} has no state for '{key}' in tag '{tag}' (version "
                f"{loaded.version}); each rank keeps only what it saved itself: call "
                f"ftrun.deepspeed.install(engine) so every data-parallel rank saves the model states")
        out = loaded.unpack(files[key], map_location)
        pending = self._loaded[2]
        pending.discard(key)
        if not pending:
            self._loaded = None  # every file served: free the buffers
        return out

    def wait(self):
        """DeepSpeed <= 0.16's hook for asynchronous engines: commit already waited."""
        return None

    def is_data_parallel_writer(self, dp_rank):
        return True

    def is_decoupled(self):
        return False

    def set_commit_info(self, info):
        pass

    def get_commit_info(self):
        return None

    def supports_async_load(self):
        return False

    def preserves_storage_sharing(self):
        return False

    def cleanup(self):
        self._pending = None
        self._loaded = None

    # -- loading ---------------------------------------------------------

    def _version(self, version, tag, path):
        if self._loaded is not None and self._loaded[0] == version:
            return self._loaded[1]
        self._loaded = None
        try:
            loaded = _state._Loaded(self.client.load(version, map=_state.load_maps()), _FORMAT)
        except _ftrun.Error as e:
            if getattr(e, "code", "") not in ("NOT_FOUND", "FAILED_PRECONDITION"):
                raise
            restore = self.client.list_versions()["restore"]
            # Only when resuming from `latest` (a crash between a commit and the
            # placeholders): the version the agent restores is the newer one.
            if restore is None or restore <= version or _latest_tag(path) != tag:
                raise FileNotFoundError(
                    f"ftrun.deepspeed: {path} names tag '{tag}' (version {version}), which the agent does not "
                    f"hold ({e}); it keeps only the last committed version "
                    f"({'none' if restore is None else restore})") from e
            loaded = _state._Loaded(self.client.load(restore, map=_state.load_maps()), _FORMAT)
            warnings.warn(f"ftrun.deepspeed: tag '{tag}' (version {version}) is gone; loading version "
                          f"{restore} (tag '{loaded.payload.get('tag')}'), the one the agent restores",
                          RuntimeWarning, stacklevel=3)
        self.tag_versions[loaded.payload.get("tag", tag)] = loaded.version
        self._loaded = (version, loaded, set(loaded.payload["files"]))
        return loaded


def _latest_tag(path):
    """The tag in the `latest` file next to path's tag directory, or None."""
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(path)), "latest")) as f:
            return f.read().strip()
    except OSError:
        return None


def _torch_load(path, map_location):
    import torch

    # DeepSpeed checkpoints hold arbitrary objects (its own engine loads them
    # with weights_only=False too, since torch 2.6 made True the default).
    return torch.load(path, map_location=map_location, weights_only=False)


def install(engine, **kwargs):
    """Makes a DeepSpeed engine (from deepspeed.initialize) checkpoint through
    ftrun: sets engine.checkpoint_engine to a new FtrunCheckpointEngine
    (kwargs go to it) and makes every data-parallel rank save the model
    states, which every rank loads. Returns the checkpoint engine."""
    ce = FtrunCheckpointEngine(getattr(engine, "_config", None), **kwargs)
    engine.checkpoint_engine = ce
    engine.save_non_zero_checkpoint = True
    return ce
