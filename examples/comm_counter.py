"""Bytes a rank sends through the embedding collectives, to ranks of other nodes and of its own.

``CommCounter`` wraps ``torch.distributed``'s all-to-alls, reduce-scatters and all-gathers (what
TorchRec's input and output dists call; DDP's all-reduce of the dense gradients is the same for
every sharding and is left out) and adds up each call's payload: for every peer, the bytes this
rank hands the collective for that peer, counted once, whatever algorithm the backend runs. A
peer is on another node when its rank // ranks-per-node differs from this rank's. That is the
figure that crosses the network between machines, for a row-wise sharding of the tables over
nodes against one that keeps them inside the node. FrugalTrainPipeline's agreement on each batch
read (4 bytes per rank, on a group of its own) is control traffic, left out like DDP's all-reduce.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from torchrec_frugal.torchrec.train_pipeline.batch_agreement import is_agreement_group

COUNTED = ("all_to_all_single", "all_to_all", "reduce_scatter", "reduce_scatter_tensor", "all_gather_into_tensor", "all_gather")


class CommCounter:
    """Counts the payload of the embedding collectives; ``install()`` once per process."""

    def __init__(self, local_size: int) -> None:
        self.local_size = local_size
        self.between_nodes = 0  # bytes to ranks of other nodes
        self.within_node = 0  # bytes to other ranks of this node
        self.calls = 0
        self._originals: Dict[str, Callable[..., Any]] = {}

    def reset(self) -> None:
        self.between_nodes = self.within_node = self.calls = 0

    def install(self) -> None:
        for name in COUNTED:
            fn = getattr(dist, name)
            self._originals[name] = fn
            setattr(dist, name, self._wrap(name, fn))

    def uninstall(self) -> None:
        for name, fn in self._originals.items():
            setattr(dist, name, fn)
        self._originals.clear()

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group")
            if is_agreement_group(group):
                return fn(*args, **kwargs)
            if name == "all_to_all_single":
                self._all_to_all_single(args[1] if len(args) > 1 else kwargs["input"],
                                        args[3] if len(args) > 3 else kwargs.get("input_split_sizes"), group)  # fmt: skip
            elif name == "all_to_all":
                self._per_peer([t.numel() * t.element_size() for t in (args[1] if len(args) > 1 else kwargs["input_tensor_list"])], group)
            elif name == "reduce_scatter":
                self._per_peer([t.numel() * t.element_size() for t in (args[1] if len(args) > 1 else kwargs["input_list"])], group)
            elif name == "reduce_scatter_tensor":
                t = args[1] if len(args) > 1 else kwargs["input"]
                n = dist.get_world_size(group)
                self._per_peer([t.numel() * t.element_size() // n] * n, group)
            else:  # all_gather_into_tensor, all_gather: this rank's tensor to every peer
                t = args[1] if len(args) > 1 else kwargs.get("input_tensor", kwargs.get("tensor"))
                self._per_peer([t.numel() * t.element_size()] * dist.get_world_size(group), group)
            return fn(*args, **kwargs)

        return counted

    def _all_to_all_single(self, t: torch.Tensor, splits: Optional[Sequence[int]], group: Any) -> None:
        n = dist.get_world_size(group)
        row = t[0].numel() * t.element_size() if t.dim() > 1 and t.shape[0] else t.element_size()
        if splits is None or len(splits) == 0:
            per = [t.numel() * t.element_size() // n] * n
        else:
            per = [int(s) * row for s in splits]
        self._per_peer(per, group)

    def _per_peer(self, nbytes: List[int], group: Any) -> None:
        me = dist.get_rank()
        for peer, b in enumerate(nbytes):
            g = peer if group is None or group is dist.GroupMember.WORLD else dist.get_global_rank(group, peer)
            if g == me:
                continue
            if g // self.local_size == me // self.local_size:
                self.within_node += b
            else:
                self.between_nodes += b
        self.calls += 1
