"""What a netns cluster claims on this machine, chosen under a lock shared
by parallel test processes: a name prefix no namespace, link or state file
uses, and a subnet 10.X.0.0/24 that overlaps no address or route here. Each
cluster records its claim in a state file under /run/ftrun-netns/ (read back
here and by cleanup_stale)."""
import fcntl
import ipaddress
import json
import os
import random
import re
import string

if __package__:
    from .netns_host import IP, NetnsError, _links_json, _netns_list, _run
else:  # beside netns_cluster imported as a top-level module (see its imports)
    from netns_host import IP, NetnsError, _links_json, _netns_list, _run

STATE_DIR = "/run/ftrun-netns"
ALIAS_TAG = "ftrun-netns"
OCTET_RANGE = range(200, 251)
IFNAMSIZ = 15  # longest interface name the kernel accepts


class _Lock:
    """Serialises subnet/prefix choice between parallel test processes."""

    def __enter__(self):
        os.makedirs(STATE_DIR, exist_ok=True)
        self.fd = os.open(os.path.join(STATE_DIR, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _used_octets():
    """Second octets X for which 10.X.0.0/16 overlaps an address or a non-default route here."""
    used = set()
    nets = []
    for argv in ((IP, "-j", "-4", "addr", "show"), (IP, "-j", "-4", "route", "show", "table", "all")):
        p = _run(list(argv), check=False)
        try:
            data = json.loads(p.stdout) if p.stdout.strip() else []
        except ValueError:
            data = []
        for e in data:
            for a in e.get("addr_info", []):
                if a.get("local"):
                    nets.append("%s/%s" % (a["local"], a.get("prefixlen", 32)))
            dst = e.get("dst")
            if dst and dst != "default":
                nets.append(dst if "/" in dst else dst + "/32")
    for n in nets:
        try:
            net = ipaddress.ip_network(n, strict=False)
        except ValueError:
            continue
        if net.prefixlen < 16:
            continue  # e.g. 10.0.0.0/8 on eth0: our /24 is more specific and wins locally
        for x in OCTET_RANGE:
            if net.overlaps(ipaddress.ip_network("10.%d.0.0/16" % x)):
                used.add(x)
    for st in _read_states():
        if isinstance(st.get("octet"), int):
            used.add(st["octet"])
    return used


def _read_states():
    out = []
    try:
        names = os.listdir(STATE_DIR)
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".json"):
            try:
                with open(os.path.join(STATE_DIR, n)) as f:
                    st = json.load(f)
                st["_file"] = os.path.join(STATE_DIR, n)
                out.append(st)
            except (OSError, ValueError):
                pass
    return out


def _default_prefix():
    alphabet = string.ascii_lowercase + string.digits
    tag = ""
    pid = os.getpid()
    for _ in range(3):  # 3 base-36 digits of the pid, then 2 random characters
        tag += alphabet[pid % 36]
        pid //= 36
    return "ftr" + tag + "".join(random.choice(string.ascii_lowercase) for _ in range(2))


def _choose_prefix(nodes, prefix):
    """`prefix` when it is valid and free for `nodes` nodes, else a free random one (prefix None)."""
    taken = set(_netns_list()) | {l.get("ifname") for l in _links_json()}
    states = {os.path.basename(s["_file"])[:-5] for s in _read_states()}
    longest = IFNAMSIZ - 1 - len(str(nodes - 1))  # "{prefix}h{i}"
    if prefix is None:
        for _ in range(100):
            prefix = _default_prefix()
            if prefix not in states and not _names_taken(nodes, prefix, taken):
                return prefix
        raise NetnsError("could not find a free cluster prefix")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", prefix):
        raise ValueError("prefix must be letters, digits and '_', starting with a letter: %r" % prefix)
    if len(prefix) > longest:
        raise ValueError("prefix %r too long: at most %d characters for %d nodes "
                         "(interface names are limited to %d)" % (prefix, longest, nodes, IFNAMSIZ))
    if prefix in states or _names_taken(nodes, prefix, taken):
        raise NetnsError("prefix %r is in use (namespace, link or state file %s/%s.json exists); "
                         "cleanup_stale(%r) removes leftovers of dead runs" % (prefix, STATE_DIR, prefix, prefix))
    return prefix


def _names_taken(nodes, prefix, taken):
    names = {prefix + "br"} | {"%s%d" % (prefix, i) for i in range(nodes)} | \
            {"%sh%d" % (prefix, i) for i in range(nodes)}
    return bool(names & taken)


def _choose_octet(octet):
    """`octet` when 10.octet.0.0/16 is free here, else a free random one (octet None)."""
    used = _used_octets()
    if octet is not None:
        if not 0 < octet < 256:
            raise ValueError("subnet_octet must be in 1..255")
        if octet in used:
            raise NetnsError("10.%d.0.0/16 is already in use on this machine" % octet)
        return octet
    free = [x for x in OCTET_RANGE if x not in used]
    if not free:
        raise NetnsError("no free subnet 10.X.0.0/24 with X in 200..250")
    return random.choice(free)
