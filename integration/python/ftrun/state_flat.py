"""A training state's structure, flattened: the skeleton of format 2.

One walk through a state's dicts, lists and tuples (flatten) gives
* the trace: every container (its type, and a dict's keys and their types)
  and, in walk order, which kind of leaf sits where: an atom, an object or
  the k-th tensor. Two states with equal traces have the same structure;
  ftrun.state_pack compares a save's trace with the last save's to reuse
  what it packed then;
* the plain tensors (torch.Tensor and nn.Parameter), each once, in the
  order first reached, with where each was first reached (its name);
* the atoms: numbers, strings, bytes, None, and lists and tuples holding
  only those (a random.getstate() is one atom, not 625), pickled as one list;
* the objects: everything else (tensor subclasses such as DTensor, numpy
  arrays, dict subclasses other than OrderedDict and defaultdict, ...),
  pickled as one list by ftrun.state_pack's tensor-aware pickler.

build() makes the structure again from a trace and its leaves
(ftrun.state_unpack). A container reached twice (shared or cyclic) cannot be
flattened: flatten raises Unflattenable and the state is pickled whole
(format 1).
"""

from collections import OrderedDict, defaultdict

import torch

from . import _ftrun

ATOM = "a"
OBJECT = "o"
_DICT = "d"
_SEQ = "s"

_DICT_TYPES = (dict, OrderedDict, defaultdict)
_ROOT = object()  # the segment of the walk's root: its path is the root path itself


class Unflattenable(Exception):
    """A container reached twice: the structure is not a tree."""


# What _ftrun.flatten tells apart, and the tokens it writes (see plugin/python/flatten.cc).
_KINDS = (torch.Tensor, torch.nn.Parameter, torch.Tensor, OrderedDict, defaultdict, ATOM, OBJECT, _DICT, _SEQ, _ROOT,
          Unflattenable)


def escape(key):
    """A dict key or field as one segment of a tensor's name ("/" and "%" escaped)."""
    s = key if isinstance(key, str) else str(key)
    if not s:
        return "%"
    return s.replace("%", "%25").replace("/", "%2F")


def join(prefix, seg):
    return seg if not prefix else prefix + "/" + seg


def path_of(where):
    """The name of what the walk reached at `where`: a (parent, segment) pair
    whose parent is the root path (a string) or such a pair in turn."""
    segs = []
    while not isinstance(where, str):
        where, seg = where
        if seg is not _ROOT:
            segs.append(escape(seg))
    for seg in reversed(segs):
        where = join(where, seg)
    return where


def _is_namedtuple(t):
    return issubclass(t, tuple) and hasattr(t, "_fields") and hasattr(t, "_make")


class Flat:
    """What flatten found; where[k]: where tensor k was first reached (path_of
    makes its name); object_paths: id(object leaf that is a tensor) -> its
    path (ftrun.sharded names a DTensor's shards by it)."""

    __slots__ = ("trace", "tensors", "where", "atoms", "objects", "_object_where", "_object_paths")

    def __init__(self, walked):
        self.trace, self.tensors, self.where, self.atoms, self.objects, self._object_where = walked
        self._object_paths = None

    @property
    def object_paths(self):
        if self._object_paths is None:
            self._object_paths = {i: path_of(at) for i, at in self._object_where.items()}
        return self._object_paths


def flatten(obj, root=""):
    """Walks obj (see the module docstring; the walk is _ftrun.flatten, in
    C++: a save walks its whole state every time); root: the path of obj
    itself. Paths are kept as (parent, segment) pairs and joined only when
    asked for (path_of): a save that reuses the last one's names never
    needs them."""
    return Flat(_ftrun.flatten(obj, root, _KINDS))


class StructureError(ValueError):
    """A saved trace that does not match its leaves (or is no trace)."""


def _take(it, what):
    try:
        return next(it)
    except StopIteration:
        raise StructureError(f"the saved structure wants more {what} than were saved") from None


def build(trace, tensor, atoms, objects):
    """The structure a trace describes; tensor(k) gives its k-th tensor (called
    once per slot), atoms and objects its leaves in walk order. A trace that
    does not fit raises StructureError (what tensor() raises passes through)."""
    tokens = iter(trace)
    atoms = iter(atoms)
    objects = iter(objects)

    def make():
        tok = _take(tokens, "containers or leaves")
        if tok == ATOM:  # (a container's token is a tuple, never equal to a string)
            return _take(atoms, "atoms")
        if tok == OBJECT:
            return _take(objects, "objects")
        if type(tok) is int:
            return tensor(tok)
        if type(tok) is tuple and len(tok) == 6 and tok[0] == _DICT and tok[1] in _DICT_TYPES:
            _, t, keys, _, factory, has_attrs = tok
            d = defaultdict(factory) if t is defaultdict else t()
            for key in keys:
                d[key] = make()
            if has_attrs:
                d.__dict__.update(make())
            return d
        if type(tok) is tuple and len(tok) == 3 and tok[0] == _SEQ and type(tok[2]) is int:
            t = tok[1]
            items = [make() for _ in range(tok[2])]
            if t is list:
                return items
            if t is tuple:
                return tuple(items)
            if isinstance(t, type) and _is_namedtuple(t):
                return t._make(items)
        raise StructureError(f"unknown token {tok!r}")

    out = make()
    if next(tokens, None) is not None:
        raise StructureError("the saved structure has tokens left over")
    return out
