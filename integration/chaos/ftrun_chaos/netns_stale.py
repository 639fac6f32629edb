"""Leftovers of crashed runs: a SIGKILLed creator leaves its namespaces
behind; cleanup_stale() removes those of dead creators, identified by the
bridge alias "ftrun-netns pid:<pid> start:<starttime> nodes:<n>" and by a
state file under /run/ftrun-netns/. leftovers() lists what of one cluster
still exists (for tests)."""
import fnmatch
import os
import re
import signal

if __package__:
    from .netns_claims import ALIAS_TAG, STATE_DIR, _Lock, _read_states
    from .netns_host import (NetnsError, _ip, _kill_netns, _link_exists, _links_json, _netns_exists, _netns_list,
                             _pid_alive, available)
else:  # beside netns_cluster imported as a top-level module (see its imports)
    from netns_claims import ALIAS_TAG, STATE_DIR, _Lock, _read_states
    from netns_host import (NetnsError, _ip, _kill_netns, _link_exists, _links_json, _netns_exists, _netns_list,
                            _pid_alive, available)

_ALIAS_RE = re.compile(ALIAS_TAG + r" pid:(\d+) start:(\d+|None)(?: nodes:(\d+))?")


def _prefix_matches(prefix, prefix_glob):
    if any(c in prefix_glob for c in "*?["):
        return fnmatch.fnmatchcase(prefix, prefix_glob)
    return prefix.startswith(prefix_glob)


def cleanup_stale(prefix_glob="ftr", verbose=False):
    """Removes clusters whose creating process is dead: those with a bridge whose alias names
    the creator, and those with a state file under /run/ftrun-netns. `prefix_glob` is a prefix
    ("ftr") or an fnmatch pattern over cluster prefixes ("ftrab*"). Returns the prefixes removed."""
    ok, _ = available()
    if not ok:
        return []
    stale = {}  # prefix -> dict(nodes=..., netns=[...], host_veths=[...], file=...)
    with _Lock():
        for l in _links_json("type", "bridge"):
            name, alias = l.get("ifname", ""), l.get("ifalias", "")
            m = _ALIAS_RE.match(alias or "")
            if not m or not name.endswith("br"):
                continue
            prefix = name[:-2]
            start = None if m.group(2) == "None" else int(m.group(2))
            if not _prefix_matches(prefix, prefix_glob) or _pid_alive(int(m.group(1)), start):
                continue
            stale.setdefault(prefix, {"netns": set(), "links": set(), "files": set()})["links"].add(name)
            # The node namespaces are {prefix}<digits>; the bridge ports tell the host veths.
            for ns in _netns_list():
                if re.fullmatch(re.escape(prefix) + r"\d+", ns):
                    stale[prefix]["netns"].add(ns)
            for port in _links_json("master", name):
                stale[prefix]["links"].add(port.get("ifname"))
        for st in _read_states():
            prefix = st.get("prefix", "")
            if not _prefix_matches(prefix, prefix_glob) or _pid_alive(int(st.get("pid", 0)), st.get("start")):
                continue
            e = stale.setdefault(prefix, {"netns": set(), "links": set(), "files": set()})
            e["netns"].update(st.get("netns", []))
            e["links"].update(st.get("host_veths", []))
            e["links"].add(st.get("bridge", prefix + "br"))
            e["files"].add(st["_file"])
        for ns in _netns_list():  # an available() probe killed half-way
            m = re.fullmatch(r"ftrprobe(\d+)", ns)
            if m and _prefix_matches(ns, prefix_glob) and not _pid_alive(int(m.group(1))):
                _ip("netns", "del", ns, check=False)
        for prefix, e in stale.items():
            for ns in sorted(e["netns"]):
                if _netns_exists(ns):
                    try:
                        _kill_netns(ns, signal.SIGKILL, 5.0)
                    except NetnsError:
                        pass
                    _ip("netns", "del", ns, check=False)
            for link in sorted(e["links"], key=lambda n: n.endswith("br")):  # ports first, bridge last
                if link and _link_exists(link):
                    _ip("link", "del", "dev", link, check=False)
            for f in e["files"]:
                try:
                    os.unlink(f)
                except FileNotFoundError:
                    pass
            if verbose:
                print("netns_cluster: removed stale cluster %s" % prefix, flush=True)
    return sorted(stale)


def leftovers(prefix):
    """Namespaces and links of cluster `prefix` that still exist (for tests)."""
    ns = [n for n in _netns_list() if re.fullmatch(re.escape(prefix) + r"\d+", n)]
    links = [l.get("ifname") for l in _links_json() if (l.get("ifname") or "").startswith(prefix)]
    state = os.path.join(STATE_DIR, prefix + ".json")
    return ns + links + ([state] if os.path.exists(state) else [])
