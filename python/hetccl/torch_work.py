"""How one operation of the torch backend runs (hetccl.torch_backend).

An operation is prepared on the caller's thread and then run:

- **Prepared.** `operation_device` checks that the tensors are on one
  device; a `Stage` for that device makes inputs contiguous where the
  library reads them, gives each output a buffer the library writes, and
  records the library calls the operation makes (`stage.lib.allReduce(...)`,
  `stage.group()`) without making them. Bad arguments raise here, on the
  caller's thread, before any call reaches the library.
- **Run.** `Stage.steps` makes the recorded calls in order, then copies
  staged outputs back. Device work (a CUDA tensor, or CPU tensors staged
  through the GPU for a communicator forwarded to NCCL) runs at once on the
  caller's thread: the library only enqueues it on the current stream,
  which is thread-local in torch. Host work runs on the backend's `Worker`,
  one thread per backend that makes the calls in the order they were
  submitted, so that the caller goes on (DDP's backward pass overlaps its
  gradient all-reduces, as with gloo) while the library blocks on its host
  buffers.

Order. Every rank must make a communicator's calls in the same order, and
the library takes a communicator's calls from one thread at a time: device
work waits for the worker to be idle before it runs (`Worker.drain`), so
calls reach the library in the order the operations were made.

Threads: `Stage` and `Worker.submit` on the caller's thread (any thread:
DDP makes its all-reduces from autograd's); the recorded calls on the
worker or on the caller.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from .nccl import groupEnd, groupStart

Step = Tuple[Callable[..., Any], Tuple[Any, ...]]


class _Recorder:
    """Stands for the communicator while an operation is prepared: each
    method call is recorded as a step. Buffers are given as tensors, which
    the step keeps alive (a scratch tensor of the preparation would be
    freed before the worker runs) and turns into addresses when it runs."""

    def __init__(self, comm: Any, steps: List[Step]) -> None:
        self._comm = comm
        self._steps = steps

    def __getattr__(self, name: str) -> Callable[..., None]:
        method = getattr(self._comm, name)
        return lambda *args: self._steps.append((_with_addresses(method), args))


def _address(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return 0 if arg.numel() == 0 else int(arg.data_ptr())
    return arg


def _with_addresses(method: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *args: method(*map(_address, args))


class _Group:
    """`with stage.group():` records ncclGroupStart ... ncclGroupEnd."""

    def __init__(self, steps: List[Step]) -> None:
        self._steps = steps

    def __enter__(self) -> None:
        self._steps.append((groupStart, ()))

    def __exit__(self, *exc: Any) -> None:
        self._steps.append((groupEnd, ()))


class Stage:
    """One operation's tensors as the library takes them and its recorded
    library calls.

    `device`: the operation's device. `work_device`: where the library
    reads and writes, `staging_device` where given: the communicator's GPU
    when CPU tensors go to a communicator forwarded to NCCL, which takes
    device memory only; the CPU when CUDA tensors go to a host rank's
    communicator, which reads host memory only.
    `stream`: the current stream of work_device (0 for host buffers)."""

    def __init__(self, comm: Any, device: torch.device,
                 staging_device: Optional[torch.device]) -> None:
        self.device = device  # operation_device of the operation's tensors
        self.work_device = staging_device if staging_device is not None else device
        self.cuda = self.work_device.type == "cuda"
        self.stream = torch.cuda.current_stream(self.work_device).cuda_stream if self.cuda else 0
        self._steps: List[Step] = []
        self._cleanup: List[Step] = []
        self._back: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.lib = _Recorder(comm, self._steps)

    # -- preparing ---------------------------------------------------------
    def group(self) -> _Group:
        return _Group(self._steps)

    def after(self, fn: Callable[..., Any], *args: Any) -> None:
        """fn(*args) once the operation has run (or failed to prepare)."""
        self._cleanup.append((fn, args))

    def input(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.work_device).contiguous()

    def output(self, t: torch.Tensor, keep: bool = False) -> torch.Tensor:
        """Where the library writes t's result; `keep`: it starts as t's
        data (in-place operations)."""
        if t.device == self.work_device and t.is_contiguous():
            return t
        buf = (t.to(self.work_device).contiguous() if keep
               else torch.empty(t.shape, dtype=t.dtype, device=self.work_device))
        self._back.append((t, buf))
        return buf

    def scratch(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=like.dtype, device=self.work_device)

    def copy_out(self, t: torch.Tensor, src: torch.Tensor) -> None:
        """t gets src's elements once the calls have run (src: a flat
        piece of the same dtype)."""
        self._back.append((t, src.view(t.shape)))

    # -- running -----------------------------------------------------------
    def steps(self) -> None:
        """Make the recorded calls, copy outputs back, then clean up."""
        try:
            for fn, args in self._steps:
                fn(*args)
            for dst, src in self._back:
                dst.copy_(src)  # stream-ordered on a GPU; a GPU -> CPU copy waits for it
        finally:
            self.cleanup()

    def cleanup(self) -> None:
        steps, self._cleanup = self._cleanup, []
        for fn, args in steps:
            fn(*args)


def operation_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    """The one device of an operation's tensors (cpu when it has none)."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"hetccl backend: one operation's tensors must be on one device, "
                         f"not {sorted(map(str, devices))}")
    device = devices.pop() if devices else torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"hetccl backend: {device.type} tensors are not supported "
                         "(cpu and cuda are)")
    return device


class Worker:
    """One thread that runs a backend's host work in submission order.

    submit() returns at once; the job's result (or exception) goes to the
    future it was given. drain() returns once every submitted job has run.
    Started on first use; stop() ends it after the jobs already queued."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: "queue.SimpleQueue[Optional[Tuple[Callable[[], Any], Any]]]" = \
            queue.SimpleQueue()
        self._lock = threading.Condition()
        self._pending = 0
        self._thread: Optional[threading.Thread] = None

    def submit(self, job: Callable[[], Any], fut: Any) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._pending += 1
        self._jobs.put((job, fut))

    def drain(self) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._pending == 0)

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            if thread is not threading.current_thread():
                thread.join()

    def _run(self) -> None:
        _name_os_thread(self._name)
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, fut = item
            try:
                result = job()
            except BaseException as e:  # the caller sees it at wait()
                fut.set_exception(e)
            else:
                fut.set_result(result)
            finally:
                with self._lock:
                    self._pending -= 1
                    self._lock.notify_all()


def _name_os_thread(name: str) -> None:
    """The OS thread's name as Python's (top -H and /proc show it; the
    kernel keeps 15 characters). Best effort."""
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def future_work(fut: torch.futures.Future) -> Any:
    """A torch Work that is the future (is_completed, wait, get_future)."""
    make = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)
    if make is not None:
        return make(fut)
    return _FutureWork(fut)  # pragma: no cover (torch without the helper)


class _FutureWork(torch.distributed.Work):  # type: ignore[misc]
    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut
