"""Admission and retirement of requests, once per engine step (vLLM v1's
vllm/v1/core/sched/scheduler.py, reduced): first come, first served, with a bounded waiting
queue.

Each `schedule()` retires nothing itself (the engine calls `finish` for what stopped) and
admits waiting requests in arrival order while fewer than `max_num_seqs` run; it returns the
running requests, which the model runner advances by one token each. This slice runs ONE
sequence at a time (`max_num_seqs` = 1): the runner has no batched decode or paged KV cache
yet. A batched runner keeps this interface: it gets up to B requests per step.

Not thread-safe by itself: the engine calls it under its lock.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from vkrt.errors import VkrtError
from vkrt.serve.request import Request, RequestStatus


class QueueFullError(VkrtError):
    """The waiting queue holds `max_queue` requests already (HTTP 429)."""


@dataclass
class SchedulerOutput:
    """What one step runs: `scheduled` (the running requests, oldest first) and `admitted`
    (those among them that start this step: the runner prefills them)."""
    scheduled: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)


class Scheduler:
    """FIFO scheduler. max_num_seqs: requests running at once (1 in this slice). max_queue:
    requests that may wait for a slot (>= 1; a new request waits until the next step admits
    it); `add_request` raises QueueFullError past it."""

    def __init__(self, max_queue: int, max_num_seqs: int = 1):
        if max_num_seqs != 1:
            raise VkrtError("the model runner decodes one sequence at a time: max_num_seqs "
                            f"must be 1, got {max_num_seqs}")
        if not (isinstance(max_queue, int) and max_queue >= 1):
            raise VkrtError(f"max_queue must be an integer >= 1, got {max_queue!r}")
        self.max_queue, self.max_num_seqs = max_queue, max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add_request(self, request: Request) -> None:
        """Queue `request`. Raises QueueFullError when `max_queue` requests wait already."""
        if len(self.waiting) >= self.max_queue:
            raise QueueFullError(f"the server is busy: {len(self.running)} running and "
                                 f"{len(self.waiting)} waiting (--max-queue "
                                 f"{self.max_queue}); retry later")
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        """Admit waiting requests while fewer than max_num_seqs run; return the running."""
        out = SchedulerOutput()
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.admitted.append(request)
        out.scheduled = list(self.running)
        return out

    def finish(self, request: Request) -> None:
        """Retire `request` (running or waiting): its slot is free for the next step."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
