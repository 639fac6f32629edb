"""Reading a chaos plan's YAML: values with the line they came from, a
reader of one mapping's fields whose errors name file:line, the field and
what was expected (PlanError), and the value formats (durations, sizes,
signals)."""
import re
import signal

import yaml


class PlanError(ValueError):
    pass


# ------------------------------------------------------------------ values

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SIZE = re.compile(r"^\s*(\d+)\s*(B|K|KiB|M|MiB|G|GiB|T|TiB)?\s*$")
_SIZE_MUL = {None: 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
             "G": 1 << 30, "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40}


def parse_duration(v):
    """'500ms', '2s', '1.5m', 3 (seconds) -> seconds; None when malformed."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if v >= 0 else None
    m = _DUR.match(str(v))
    if not m:
        return None
    return float(m.group(1)) * {"ms": 0.001, None: 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def parse_size(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    m = _SIZE.match(str(v))
    return int(m.group(1)) * _SIZE_MUL[m.group(2)] if m else None


def parse_signal(v):
    """'SIGKILL', 'KILL', 9 -> signal number; None when unknown."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v if 0 < v < signal.NSIG else None
    name = str(v).upper()
    name = name if name.startswith("SIG") else "SIG" + name
    s = getattr(signal.Signals, name, None) if name in signal.Signals.__members__ else None
    return int(s) if s is not None else None


# ------------------------------------------------------------------ YAML with line numbers

class _Node:
    """A YAML value with the line it came from."""

    def __init__(self, value, line):
        self.value, self.line = value, line


def _convert(node):
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out = {}
        for k, v in node.value:
            out[str(k.value)] = (_convert(v), k.start_mark.line + 1)
        return _Node(out, line)
    if isinstance(node, yaml.SequenceNode):
        return _Node([_convert(v) for v in node.value], line)
    return _Node(yaml.safe_load(yaml.serialize(node)), line)


class _Reader:
    """Reads fields of one mapping; errors name file:line and the field path."""

    def __init__(self, path, node, where):
        self.path, self.node, self.where = path, node, where
        if not isinstance(node.value, dict):
            self.fail(node.line, where, "expected a mapping, got %s" % _kind(node.value))
        self.seen = set()

    def fail(self, line, field, msg):
        raise PlanError("%s:%d: %s: %s" % (self.path, line, field, msg))

    def field(self, key):
        return key if not self.where else self.where + "." + key

    def has(self, key):
        return key in self.node.value

    def line(self, key):
        return self.node.value[key][1] if key in self.node.value else self.node.line

    def raw(self, key, default=None):
        self.seen.add(key)
        if key not in self.node.value:
            return default
        return self.node.value[key][0]

    def get(self, key, default=None):
        n = self.raw(key)
        return default if n is None else _plain(n)

    def sub(self, key):
        n = self.raw(key)
        return _Reader(self.path, n, self.field(key)) if n is not None else None

    def int(self, key, default, lo=None, hi=None):
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = "" if lo is None else (" >= %d" % lo if hi is None else " in %d..%d" % (lo, hi))
            self.fail(self.line(key), self.field(key), "expected an integer%s, got %r" % (rng, v))
        return v

    def number(self, key, default, lo=0.0, hi=None):
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or (hi is not None and v > hi):
            self.fail(self.line(key), self.field(key), "expected a number >= %g%s, got %r" % (
                lo, "" if hi is None else " and <= %g" % hi, v))
        return float(v)

    def duration(self, key, default):
        v = self.get(key, default)
        d = parse_duration(v) if v is not None else None
        if v is not None and d is None:
            self.fail(self.line(key), self.field(key), "expected a duration like 500ms, 2s or 1m, got %r" % (v,))
        return d

    def size(self, key, default):
        v = self.get(key, default)
        s = parse_size(v)
        if s is None:
            self.fail(self.line(key), self.field(key), "expected a size like 4096, 64MiB or 1G, got %r" % (v,))
        return s

    def string(self, key, default, choices=None):
        v = self.get(key, default)
        if not isinstance(v, str) or (choices and v not in choices):
            self.fail(self.line(key), self.field(key), "expected %s, got %r" % (
                "one of " + ", ".join(choices) if choices else "a string", v))
        return v

    def done(self):
        extra = sorted(set(self.node.value) - self.seen)
        if extra:
            k = extra[0]
            self.fail(self.line(k), self.field(k), "unknown key (expected one of %s)" % ", ".join(sorted(self.seen)))


def _plain(n):
    if isinstance(n.value, dict):
        return {k: _plain(v) for k, (v, _) in n.value.items()}
    if isinstance(n.value, list):
        return [_plain(v) for v in n.value]
    return n.value


def _kind(v):
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing"}.get(type(v), type(v).__name__)
