"""ftrun.warm_interrupt: places inside torch where a survivor's Restart can land.

A Python signal handler runs only between bytecodes of the main thread. A
forward or backward pass is one call from Python's view (`loss.backward()`
runs the whole backward graph in C++), so a survivor told to leave in the
middle of one got its Restart only when the pass returned: hundreds of
milliseconds on a loaded CPU, every warm recovery. These hooks give it a
chance at every module call of a forward pass (a global forward pre-hook) and
at every parameter's gradient in a backward pass (a gradient hook, put on the
parameters of each module the forward pre-hook sees). A hook only calls
`check`, which raises ftrun.Restart in the main thread once the generation
ends and returns at once otherwise; an exception raised in a gradient hook
ends the backward pass and comes out of `backward()` as itself.
"""

import sys
import threading
import weakref


class Interrupts:
    def __init__(self, check):
        self._check = check
        self._forward = None  # the global forward pre-hook's handle
        self._hooked = {}  # id(parameter) -> weakref to it: its gradient hook is in place
        self._main = threading.main_thread().ident

    def install(self):
        """Idempotent; a no-op until torch is imported (call it again later)."""
        torch = sys.modules.get("torch")
        if self._forward is not None or torch is None or not hasattr(torch, "nn"):
            return
        register = getattr(torch.nn.modules.module, "register_module_forward_pre_hook", None)
        if register is not None:
            self._forward = register(self._on_forward)

    def remove(self):
        if self._forward is not None:
            self._forward.remove()
            self._forward = None

    def _on_forward(self, module, inputs):
        if threading.get_ident() != self._main:
            return None
        self._check()
        for p in module.parameters(recurse=False):
            ref = self._hooked.get(id(p))
            if p.requires_grad and (ref is None or ref() is not p):
                p.register_hook(self._on_grad)
                self._hooked[id(p)] = weakref.ref(p, lambda _, k=id(p): self._hooked.pop(k, None))
        return None

    def _on_grad(self, grad):
        if threading.get_ident() == self._main:
            self._check()
        return None
