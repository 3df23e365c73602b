"""Checkpoints of the example training scripts: TorchRec-compatible, written atomically, resumed by themselves.

A job that loses a rank (``torchrun --max-restarts=N`` restarts every rank) continues from the
newest complete checkpoint and ends where an uninterrupted run ends. Layout of ``--checkpoint-dir``:

- ``step_<N>/``: a complete checkpoint. ``torch.distributed.checkpoint`` (DCP) files of
  ``{"model": model.state_dict(), "optim": optimizer.state_dict()}`` (frugal tables as row-block
  ShardedTensors, stock TorchRec tables as TorchRec shards them, the fused and dense optimizers'
  state), ``rank_<r>.pt`` (each rank's step, RNG state and whatever the script needs to continue
  exactly), and ``COMPLETE`` (JSON: step, world size), written last.
- ``step_<N>.tmp-<id>/``: a checkpoint being written. Rank 0 renames it to ``step_<N>`` only after
  every rank wrote its part, so an interrupted write never becomes the newest complete checkpoint;
  rank 0 removes such leftovers when a run starts.

Fault injection for tests and benchmarks: ``FRUGAL_EXAMPLE_KILL_AT=<rank>:<step>`` makes that rank
SIGKILL itself after that step on the job's first attempt (``TORCHELASTIC_RESTART_COUNT`` 0).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

MARKER = "COMPLETE"
KILL_ENV = "FRUGAL_EXAMPLE_KILL_AT"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_PARTIAL_DIR = re.compile(r"^step_\d+\.tmp-")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint-dir", default=None,
                   help="save checkpoints here and resume from the newest complete one found at start")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save every N steps (0: only at the end); the end of the run always saves")
    p.add_argument("--checkpoint-keep", type=int, default=2, help="complete checkpoints kept (the newest)")


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.checkpoint_every < 0:
        p.error(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if args.checkpoint_keep < 1:
        p.error(f"--checkpoint-keep must be >= 1, got {args.checkpoint_keep}")
    if args.checkpoint_every and not args.checkpoint_dir:
        p.error("--checkpoint-every needs --checkpoint-dir")


def complete_checkpoints(directory: Path) -> List[Tuple[int, Path]]:
    """(step, path) of every complete checkpoint in ``directory``, oldest first.

    Complete: named ``step_<N>`` and holding a ``COMPLETE`` marker that names step N; partial
    writes (``step_<N>.tmp-*``) and directories without the marker are not.
    """
    found = []
    for path in directory.iterdir() if directory.is_dir() else []:
        m = _STEP_DIR.match(path.name)
        if not m or not path.is_dir():
            continue
        try:
            marker = json.loads((path / MARKER).read_text())
        except (OSError, ValueError):
            continue
        if marker.get("step") == int(m.group(1)):
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(directory: Path) -> Optional[Tuple[int, Path]]:
    """The newest complete checkpoint in ``directory`` as (step, path), or None."""
    found = complete_checkpoints(directory)
    return found[-1] if found else None


def remove_partial(directory: Path) -> List[Path]:
    """Remove checkpoint writes that never completed (``step_<N>.tmp-*``); returns what was removed."""
    removed = []
    for path in directory.iterdir() if directory.is_dir() else []:
        if _PARTIAL_DIR.match(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def kill_step(rank: int) -> Optional[int]:
    """The step after which this rank SIGKILLs itself (``FRUGAL_EXAMPLE_KILL_AT``), on the first attempt only."""
    spec = os.environ.get(KILL_ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    try:
        who, step = (int(x) for x in spec.split(":"))
    except ValueError:
        raise SystemExit(f"{KILL_ENV}={spec!r}: expected <rank>:<step>, e.g. 1:25") from None
    return step if who == rank else None


def kill_if_due(rank: int, step: int, at: Optional[int]) -> None:
    """SIGKILL this process after step ``at`` (see :func:`kill_step`): no clean-up runs, as in a crash."""
    if at is not None and step == at:
        print(f"[fault] rank {rank} SIGKILLs itself after step {step} at unix time {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def _rng_state() -> Dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Checkpointer:
    """Saves and resumes one job's checkpoints (collective calls: every rank calls them alike).

    Args:
        directory: ``--checkpoint-dir``; None disables saving and resuming.
        every: save after every ``every`` steps (0: only after the last).
        keep: complete checkpoints kept; rank 0 removes older ones after each save.
    """

    def __init__(self, directory: Optional[str], every: int, keep: int) -> None:
        self.directory = Path(directory) if directory else None
        self.every = every
        self.keep = keep
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.written: List[int] = []
        self.seconds = 0.0  # spent saving, for throughput figures that leave it out

    def resume_point(self, last_step: int) -> Optional[Tuple[int, Path]]:
        """(step, path) of the newest complete checkpoint, the same on every rank; None if none.

        Rank 0 first removes partial writes left by an interrupted attempt. A checkpoint past
        ``last_step`` (the run's --steps) stops the run: it cannot be continued to that end.
        """
        if self.directory is None:
            return None
        found: List[Optional[Tuple[int, str]]] = [None]
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            for path in remove_partial(self.directory):
                print(f"[checkpoint] removed the partial write {path}", flush=True)
            latest = latest_checkpoint(self.directory)
            found[0] = (latest[0], str(latest[1])) if latest else None
        dist.broadcast_object_list(found, src=0)
        if found[0] is None:
            return None
        step, path = found[0]
        if step > last_step:
            raise SystemExit(f"{path} holds step {step}, past --steps {last_step}: raise --steps or give another --checkpoint-dir")
        return step, Path(path)

    def data_parallel_wrapper(self) -> Optional[Any]:
        """DistributedModelParallel's wrapper of the dense layers: with checkpoints, a DDP that keeps
        its first gradient buckets; None (TorchRec's default) without.

        By default DDP rebuilds its buckets after the first backward of every start, so the first
        step after a resume would all-reduce the dense gradients in other buckets than the
        uninterrupted run had, and a ring all-reduce over more than 2 ranks would add some of
        them in another order. ``find_unused_parameters`` without a static graph never rebuilds.
        """
        if self.directory is None:
            return None
        from torchrec.distributed.model_parallel import DefaultDataParallelWrapper

        return DefaultDataParallelWrapper(static_graph=False, find_unused_parameters=True)

    def due(self, step: int, last_step: int) -> bool:
        return self.directory is not None and (step == last_step or (self.every > 0 and step % self.every == 0))

    def save(self, step: int, model: nn.Module, optimizer: Any, local: Dict[str, Any]) -> Path:
        """Write step ``step``: model and optimizer state through DCP, ``local`` (this rank's own
        state, CPU tensors and plain values) beside it. Returns once the checkpoint is complete."""
        assert self.directory is not None
        t0 = time.perf_counter()
        state = {"model": model.state_dict(), "optim": optimizer.state_dict()}  # collective
        token: List[Optional[str]] = [uuid.uuid4().hex[:12] if self.rank == 0 else None]
        dist.broadcast_object_list(token, src=0)
        partial = self.directory / f"step_{step}.tmp-{token[0]}"
        dcp.save(state, checkpoint_id=partial)
        torch.save({"step": step, "rng": _rng_state(), **local}, partial / f"rank_{self.rank}.pt")
        dist.barrier()  # every rank's part is on disk
        final = self.directory / f"step_{step}"
        if self.rank == 0:
            with open(partial / MARKER, "w") as f:
                json.dump({"step": step, "world_size": self.world, "unix_time": time.time()}, f)
                f.flush()
                os.fsync(f.fileno())
            if final.exists():  # a directory of that name without the marker: never complete
                shutil.rmtree(final)
            os.rename(partial, final)
            for _, old in complete_checkpoints(self.directory)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()  # no rank goes on before the checkpoint is complete
        self.written.append(step)
        self.seconds += time.perf_counter() - t0
        return final

    def load(self, path: Path, model: nn.Module, optimizer: Any) -> Dict[str, Any]:
        """Load ``path`` into ``model`` and ``optimizer`` (frugal tables through their load hook),
        restore this rank's RNG state, and return the ``local`` state this rank saved."""
        marker = json.loads((path / MARKER).read_text())
        if marker["world_size"] != self.world:
            raise SystemExit(
                f"{path} was written by {marker['world_size']} ranks, this job has {self.world}: resume it "
                "with the same number of ranks, or give another --checkpoint-dir"
            )
        state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        dcp.load(state, checkpoint_id=path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        mine = path / f"rank_{self.rank}.pt"
        local = torch.load(mine, weights_only=True)
        if local.pop("step") != marker["step"]:
            raise RuntimeError(f"{mine} does not belong to step {marker['step']} of {path}")
        _set_rng_state(local.pop("rng"))
        return local
