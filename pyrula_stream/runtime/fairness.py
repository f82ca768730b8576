"""Fair admission: ready turns wait for a slot in one queue per tenant, served in turn.

Without it a worker starts turns in the order it reads them, so a tenant that floods the
turns topic makes every other tenant on those partitions wait behind its backlog. Here
the turns that may start (the head of their key's queue: per-key order is the
partition's business, ``PartitionState.enqueue``) wait in their tenant's FIFO, and a
free slot goes to the next tenant in rotation that has a turn waiting and room under its
``max_concurrent_turns``. The input offset still commits in order (the watermark does
not care in which order turns end).

The bound (docs/tenants.md): a turn that has been read waits for at most ``T - 1``
admissions of other tenants for each turn of its own tenant ahead of it in its queue
(``T``: tenants with turns waiting on the worker). Before it is read, a flood ahead of
it in its partition delays it by at most the admissions that bring the worker's queue
below ``max_queued_turns``, the read-ahead (``WorkerOptions.max_queued_turns``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable

from pyrula_stream.agent.tenants import DEFAULT_TENANT, TenantLimits
from pyrula_stream.runtime.partition import QueuedTurn


def tenant_of(queued: QueuedTurn) -> str:
    """The queued turn's tenant (a request read before tenants existed has none)."""
    return queued.request.tenant or DEFAULT_TENANT


class FairQueue:
    """Turns waiting for a slot, one FIFO per tenant, tenants served round-robin."""

    def __init__(self) -> None:
        self._tenants: OrderedDict[str, deque[tuple[int, QueuedTurn]]] = OrderedDict()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def tenants(self) -> int:
        """Tenants with turns waiting."""
        return len(self._tenants)

    def waiting(self, tenant: str) -> int:
        q = self._tenants.get(tenant)
        return len(q) if q is not None else 0

    def push(self, partition: int, queued: QueuedTurn) -> None:
        """Queue the turn behind its tenant's earlier ones; a tenant new to the queue
        joins the rotation last, so it waits at most one round."""
        tenant = tenant_of(queued)
        q = self._tenants.get(tenant)
        if q is None:
            q = self._tenants[tenant] = deque()
        q.append((partition, queued))
        self._count += 1

    def pop(self, has_room: Callable[[str], bool]) -> tuple[int, QueuedTurn] | None:
        """The next tenant's oldest turn, skipping tenants without room; the served
        tenant moves to the back of the rotation. ``None`` when no tenant can run now."""
        for tenant in self._tenants:
            if has_room(tenant):
                break
        else:
            return None
        q = self._tenants[tenant]
        item = q.popleft()
        self._count -= 1
        if q:
            self._tenants.move_to_end(tenant)
        else:
            del self._tenants[tenant]
        return item

    def drop_partitions(self, partitions: Iterable[int]) -> None:
        """Forget the waiting turns of revoked partitions (their next owner reads them)."""
        gone = set(partitions)
        for tenant in list(self._tenants):
            q = self._tenants[tenant]
            kept = deque(item for item in q if item[0] not in gone)
            self._count -= len(q) - len(kept)
            if kept:
                self._tenants[tenant] = kept
            else:
                del self._tenants[tenant]

    def clear(self) -> None:
        self._tenants.clear()
        self._count = 0


class TenantRoom:
    """Which tenants may start one more turn, by their ``max_concurrent_turns``.

    Counts the tenants' turns with a task on this worker: the cap is per worker (a group
    of W workers runs at most W times it), as docs/tenants.md says. ``running`` is read
    only once a tenant with a cap asks: an agent without tenant caps (most) does not count
    its hundreds of running turns each time a slot frees.
    """

    def __init__(
        self, limits: Callable[[str], TenantLimits], running: Callable[[], Iterable[str]]
    ) -> None:
        self._limits = limits
        self._running = running
        self._counts: Counter[str] | None = None

    def has_room(self, tenant: str) -> bool:
        cap = self._limits(tenant).max_concurrent_turns
        if cap is None:
            return True
        if self._counts is None:
            self._counts = Counter(self._running())
        return self._counts[tenant] < cap

    def started(self, tenant: str) -> None:
        """A turn of ``tenant`` starts (before it joins ``running``: once counted, the
        counts are not read again)."""
        if self._counts is not None:
            self._counts[tenant] += 1


__all__ = ["FairQueue", "TenantRoom", "tenant_of"]
