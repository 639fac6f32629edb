"""The netns clusters this process has not torn down yet, and the exit paths
that tear them down: atexit, and SIGTERM/SIGINT/SIGHUP while a cluster lives
(the signal is re-delivered after cleanup, so the process still dies of it).
NetnsCluster adds itself to _live and removes itself on teardown. Stdlib only."""
import atexit
import os
import signal
import threading

_live = []  # clusters not yet torn down, oldest first
_live_lock = threading.RLock()
_prev_handlers = {}
_atexit_done = False
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _teardown_all():
    with _live_lock:
        clusters = list(reversed(_live))
    for c in clusters:
        try:
            c.teardown()
        except Exception as e:  # keep going: the others must still go
            print("netns_cluster: teardown of %s failed: %s" % (c.prefix, e), flush=True)


def _on_signal(signum, frame):
    prev = _prev_handlers.get(signum, signal.SIG_DFL)  # before teardown restores the handlers
    _teardown_all()
    _restore_handlers()
    if callable(prev):
        prev(signum, frame)  # e.g. default_int_handler raises KeyboardInterrupt
    elif prev != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of the signal, as without us


def _install_handlers():
    global _atexit_done
    if not _atexit_done:
        atexit.register(_teardown_all)
        _atexit_done = True
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still covers exit
    for s in _SIGNALS:
        if s in _prev_handlers:
            continue
        prev = signal.getsignal(s)
        if prev == signal.SIG_IGN or prev is None:
            continue  # ignored signals stay ignored (e.g. SIGHUP under nohup)
        _prev_handlers[s] = prev
        signal.signal(s, _on_signal)


def _restore_handlers():
    if threading.current_thread() is not threading.main_thread():
        return
    for s, prev in list(_prev_handlers.items()):
        if signal.getsignal(s) is _on_signal:
            signal.signal(s, prev)
        del _prev_handlers[s]
