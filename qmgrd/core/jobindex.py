"""The indexed preemption candidate search (notes §5.3): Postfix's choice without the linear walk.

Contract
--------
A :class:`JobIndex` mirrors one transport's ``job_list`` (scheduler order) in a three-level tree of
Python lists: the index holds groups (at most ``GROUP_MAX`` chunks each), a group holds chunks (at
most ``CHUNK_MAX`` jobs each), a chunk holds jobs. ``job.py`` keeps it in step with every change
of ``job_list`` (:meth:`JobIndex.insert_after`,
:meth:`JobIndex.move_before`, :meth:`JobIndex.remove`), and the scheduler calls
:func:`index_touch` after every change that can make a linked job a better candidate than before
(fewer needed entries, fewer total entries, stack level back to 0). Missing a touch is a bug that
the equivalence property test (tests/unit/core/test_candidate_index.py) is there to catch.

:func:`candidate_search` returns exactly the job that :func:`candidate_linear` (a line-by-line
copy of Postfix's ``qmgr_job_candidate`` loop) returns, for any state.

Theory of operation
-------------------
Postfix walks the jobs after the current one, in list order, keeping the best score ``s`` (the
first job with the highest ``delay / total`` among those with ``0 < needed <= max_slots``) and
stopping at the first stack-level-0 job with ``delay <= s``. Between two events of that walk (a new
best, or the stop) nothing happens, so whole runs of jobs can be skipped if we can tell that none
of them is an event. Each chunk, each group and the index keep conservative bounds over their
jobs:

- ``min_needed``, ``min_total``, ``min_qt``: lower bounds of needed entries, total entries and
  (whole-second) queued time over the jobs with ``needed > 0``;
- ``max_qt0``: an upper bound of the queued time of the jobs at stack level 0.

With ``T = now + 1`` (so ``delay = T - qt``), a run can hold no event when
``T - max_qt0 > s`` (no level-0 job is young enough to stop the walk) and either
``min_needed > max_slots`` or ``(T - min_qt) / min_total <= s`` (no job fits, or none can score
above ``s``: its score is at most that bound, and float division of integers is monotone). The
walk visits a chunk's jobs one by one, with Postfix's own per-job logic, only when its bounds allow
an event; a fully walked chunk gets exact bounds again. Blockers and stack parents are skipped by
the walk itself; the bounds include them (a superset keeps them safe, and a blocker tag bump,
which unblocks every job at once, then needs no update at all).

Bounds only ever need tightening on events that make a job more attractive (needed or total
entries shrink, the job returns to stack level 0, it joins the chunk); changes in the other
direction (more entries read, the job joins a stack, is marked a blocker or leaves the chunk) leave
them valid, merely loose until the next walk through the chunk recomputes them. The index itself
keeps the same bounds over all jobs, and they nest (index within group within chunk), so an update
is O(1) and stops at the first level it does not change.

Cost: list surgery is O(CHUNK_MAX + GROUP_MAX + groups) in C-level list operations. A search
checks the bounds of the current job's chunk and group, then of the whole index; when no job can
fit or score (the common case: the negative result Postfix would find only after walking every
job; the bounds include the current job and those before it, so they must not fit either) it
ends there, in O(CHUNK_MAX + GROUP_MAX) whatever the number of jobs. Otherwise it walks
the chunks that may hold an event: the new best jobs and the stop, which Postfix's early stop
keeps close in time order. The bounds are conservative (the job that fits need not be the one
that scores), so a workload that mixes old large jobs and young small ones in every chunk can make
the walk visit chunks where nothing happens; the worst case stays linear, as Postfix's.

Times are whole seconds as in Postfix (``int(queued_time)``); counters are ints; the score is a
float, compared exactly as in the linear walk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qmgrd.errors import InvariantError

if TYPE_CHECKING:
    from qmgrd.core.job import Job

__all__ = [
    "Chunk",
    "Group",
    "JobIndex",
    "candidate_linear",
    "candidate_search",
    "index_check",
    "index_touch",
]

CHUNK_MAX = 32  # jobs per chunk before it splits in two
GROUP_MAX = 32  # chunks per group before it splits in two

_BIG = 1 << 62  # "no job": min bounds start here
_SMALL = -_BIG  # "no level-0 job": the max bound starts here


@dataclass(slots=True, eq=False)
class Chunk:
    """A run of consecutive jobs of the list, with conservative bounds over them."""

    group: Group
    jobs: list[Job] = field(default_factory=list)
    min_needed: int = _BIG
    min_total: int = _BIG
    min_qt: int = _BIG
    max_qt0: int = _SMALL


@dataclass(slots=True, eq=False)
class Group:
    """A run of consecutive chunks, with bounds over all their jobs."""

    index: JobIndex
    chunks: list[Chunk] = field(default_factory=list)
    min_needed: int = _BIG
    min_total: int = _BIG
    min_qt: int = _BIG
    max_qt0: int = _SMALL


def _tighten(node: Chunk | Group | JobIndex, job: Job) -> None:
    """Make ``node``'s bounds cover ``job``'s current values."""
    message = job.message
    qt = int(message.queued_time)
    total = job.read_entries + message.rcpt_unread
    needed = total - job.selected_entries
    if needed > 0:
        if needed < node.min_needed:
            node.min_needed = needed
        if total < node.min_total:
            node.min_total = total
        if qt < node.min_qt:
            node.min_qt = qt
    if job.stack_level == 0 and qt > node.max_qt0:
        node.max_qt0 = qt


def _chunk_recompute(chunk: Chunk) -> None:
    """Exact bounds of a chunk from its jobs."""
    chunk.min_needed = chunk.min_total = chunk.min_qt = _BIG
    chunk.max_qt0 = _SMALL
    for job in chunk.jobs:
        _tighten(chunk, job)


def _group_recompute(group: Group) -> None:
    """Bounds of a group from its chunks' bounds."""
    mn = mt = mq = _BIG
    mx = _SMALL
    for c in group.chunks:
        if c.min_needed < mn:
            mn = c.min_needed
        if c.min_total < mt:
            mt = c.min_total
        if c.min_qt < mq:
            mq = c.min_qt
        if c.max_qt0 > mx:
            mx = c.max_qt0
    group.min_needed, group.min_total, group.min_qt, group.max_qt0 = mn, mt, mq, mx


def _root_recompute(index: JobIndex) -> None:
    """Bounds of the whole index from its groups' bounds."""
    mn = mt = mq = _BIG
    mx = _SMALL
    for g in index.groups:
        if g.min_needed < mn:
            mn = g.min_needed
        if g.min_total < mt:
            mt = g.min_total
        if g.min_qt < mq:
            mq = g.min_qt
        if g.max_qt0 > mx:
            mx = g.max_qt0
    index.min_needed, index.min_total, index.min_qt, index.max_qt0 = mn, mt, mq, mx


def _merge_bounds(into: Chunk | Group, other: Chunk | Group | JobIndex) -> None:
    into.min_needed = min(into.min_needed, other.min_needed)
    into.min_total = min(into.min_total, other.min_total)
    into.min_qt = min(into.min_qt, other.min_qt)
    into.max_qt0 = max(into.max_qt0, other.max_qt0)


class JobIndex:
    """One transport's job list as groups of chunks of jobs (see the module docstring)."""

    __slots__ = ("count", "groups", "max_qt0", "min_needed", "min_qt", "min_total")

    def __init__(self) -> None:
        """Start empty."""
        self.groups: list[Group] = []
        self.count = 0
        # Bounds over every job, as in Chunk and Group.
        self.min_needed = self.min_total = self.min_qt = _BIG
        self.max_qt0 = _SMALL

    def __len__(self) -> int:
        """Number of jobs in the index."""
        return self.count

    def jobs(self) -> list[Job]:
        """Every job in list order (for checks and tests; O(n))."""
        return [job for g in self.groups for c in g.chunks for job in c.jobs]

    # ------------------------------------------------------------------ list surgery

    def insert_after(self, job: Job, ref: Job | None) -> None:
        """Put ``job`` right after ``ref`` (None: at the head), as ``DList.insert_after``."""
        if job.index_chunk is not None:
            raise InvariantError(f"job index: {job.describe()} is already indexed")
        if ref is None:
            if not self.groups:
                group = Group(self)
                group.chunks.append(Chunk(group))
                self.groups.append(group)
            chunk = self.groups[0].chunks[0]
            pos = 0
        else:
            chunk = _chunk_of(ref)
            pos = chunk.jobs.index(ref) + 1
        self._put(job, chunk, pos)

    def move_before(self, job: Job, ref: Job) -> None:
        """Move the indexed ``job`` right before ``ref`` (preemption)."""
        self.remove(job)
        chunk = _chunk_of(ref)
        self._put(job, chunk, chunk.jobs.index(ref))

    def remove(self, job: Job) -> None:
        """Take ``job`` out of the index."""
        chunk = _chunk_of(job)
        chunk.jobs.remove(job)
        job.index_chunk = None
        self.count -= 1
        group = chunk.group
        if not chunk.jobs:
            group.chunks.remove(chunk)
            if not group.chunks:
                self.groups.remove(group)
                return
        elif len(chunk.jobs) <= CHUNK_MAX // 4:
            self._chunk_merge(chunk)
        if len(group.chunks) <= GROUP_MAX // 4:
            self._group_merge(group)

    def _put(self, job: Job, chunk: Chunk, pos: int) -> None:
        chunk.jobs.insert(pos, job)
        job.index_chunk = chunk
        self.count += 1
        _tighten(chunk, job)
        _tighten(chunk.group, job)
        _tighten(self, job)
        if len(chunk.jobs) > CHUNK_MAX:
            self._chunk_split(chunk)

    def _chunk_split(self, chunk: Chunk) -> None:
        group = chunk.group
        half = len(chunk.jobs) // 2
        new = Chunk(group, chunk.jobs[half:])
        del chunk.jobs[half:]
        for job in new.jobs:
            job.index_chunk = new
        _chunk_recompute(chunk)
        _chunk_recompute(new)
        group.chunks.insert(group.chunks.index(chunk) + 1, new)
        if len(group.chunks) > GROUP_MAX:
            half = len(group.chunks) // 2
            ng = Group(self, group.chunks[half:])
            del group.chunks[half:]
            for c in ng.chunks:
                c.group = ng
            _group_recompute(group)
            _group_recompute(ng)
            self.groups.insert(self.groups.index(group) + 1, ng)

    def _chunk_merge(self, chunk: Chunk) -> None:
        """Merge a small chunk into a neighbour of the same group if they fit in one."""
        chunks = chunk.group.chunks
        i = chunks.index(chunk)
        if i + 1 < len(chunks) and len(chunks[i + 1].jobs) + len(chunk.jobs) <= CHUNK_MAX:
            other = chunks[i + 1]
            other.jobs[:0] = chunk.jobs
        elif i > 0 and len(chunks[i - 1].jobs) + len(chunk.jobs) <= CHUNK_MAX:
            other = chunks[i - 1]
            other.jobs.extend(chunk.jobs)
        else:
            return
        for job in chunk.jobs:
            job.index_chunk = other
        _merge_bounds(other, chunk)
        del chunks[i]

    def _group_merge(self, group: Group) -> None:
        """Merge a small group into a neighbour if they fit in one."""
        groups = self.groups
        i = groups.index(group)
        if i + 1 < len(groups) and len(groups[i + 1].chunks) + len(group.chunks) <= GROUP_MAX:
            other = groups[i + 1]
            other.chunks[:0] = group.chunks
        elif i > 0 and len(groups[i - 1].chunks) + len(group.chunks) <= GROUP_MAX:
            other = groups[i - 1]
            other.chunks.extend(group.chunks)
        else:
            return
        for c in group.chunks:
            c.group = other
        _merge_bounds(other, group)
        del groups[i]


def _chunk_of(job: Job) -> Chunk:
    chunk = job.index_chunk
    if chunk is None:
        raise InvariantError(f"job index: {job.describe()} is not indexed")
    return chunk


def index_touch(job: Job) -> None:
    """A linked job may have become a better candidate: tighten its chunk and group bounds."""
    chunk = job.index_chunk
    if chunk is None:
        return
    # _tighten on the chunk, its group and the index, inlined: this runs on every selection. The
    # bounds nest (index within group within chunk), so a level that needs no change ends it.
    group = chunk.group
    root = group.index
    message = job.message
    qt = int(message.queued_time)
    total = job.read_entries + message.rcpt_unread
    needed = total - job.selected_entries
    if needed > 0:
        if needed < chunk.min_needed:
            chunk.min_needed = needed
            if needed < group.min_needed:
                group.min_needed = needed
                if needed < root.min_needed:
                    root.min_needed = needed
        if total < chunk.min_total:
            chunk.min_total = total
            if total < group.min_total:
                group.min_total = total
                if total < root.min_total:
                    root.min_total = total
        if qt < chunk.min_qt:
            chunk.min_qt = qt
            if qt < group.min_qt:
                group.min_qt = qt
                if qt < root.min_qt:
                    root.min_qt = qt
    if job.stack_level == 0 and qt > chunk.max_qt0:
        chunk.max_qt0 = qt
        if qt > group.max_qt0:
            group.max_qt0 = qt
            if qt > root.max_qt0:
                root.max_qt0 = qt


# --------------------------------------------------------------------------- the searches


def _max_slots(current: Job) -> int:
    # C int division truncates; the numerator's sign only matters for "> 0", same result.
    return (
        current.read_entries - current.selected_entries + current.slots_available
    ) // current.transport.params.delivery_slot_cost


def candidate_linear(current: Job, now: int, max_slots: int | None = None) -> Job | None:
    """Postfix's ``qmgr_job_candidate`` walk (without its cache): the reference for tests.

    ``max_slots`` overrides the limit Postfix derives from ``current`` (tests use it to probe
    every limit).
    """
    if max_slots is None:
        max_slots = _max_slots(current)
    best: Job | None = None
    best_score = 0.0
    if max_slots > 0:
        tag = current.transport.blocker_tag
        link = current.transport_link.next
        while link is not None:
            job = link.item
            link = link.next
            if job.stack_children or job.blocker_tag == tag:
                continue
            total = job.read_entries + job.message.rcpt_unread
            needed = total - job.selected_entries
            delay = now - int(job.message.queued_time) + 1
            if 0 < needed <= max_slots:
                score = delay / total
                if score > best_score:
                    best, best_score = job, score
            if delay <= best_score and job.stack_level == 0:
                break
    return best


class _Walk:
    """State of one indexed search: Postfix's loop variables plus the skip test."""

    __slots__ = ("best", "max_slots", "score", "stopped", "tag", "when")

    def __init__(self, when: int, max_slots: int, tag: int) -> None:
        self.when = when  # now + 1: delay = when - qt
        self.max_slots = max_slots
        self.tag = tag
        self.best: Job | None = None
        self.score = 0.0
        self.stopped = False

    def quiet(self, node: Chunk | Group | JobIndex) -> bool:
        """True when no job under ``node`` can become the best or stop the walk."""
        score = self.score
        if self.when - node.max_qt0 <= score:
            return False
        if node.min_needed > self.max_slots:
            return True
        num = self.when - node.min_qt
        return num <= 0 or num / node.min_total <= score

    def scan(self, jobs: list[Job], start: int) -> None:
        """Postfix's per-job logic over ``jobs[start:]``; sets ``stopped`` at the early stop."""
        when = self.when
        max_slots = self.max_slots
        tag = self.tag
        best = self.best
        best_score = self.score
        for i in range(start, len(jobs)):
            job = jobs[i]
            if job.stack_children or job.blocker_tag == tag:
                continue
            message = job.message
            total = job.read_entries + message.rcpt_unread
            needed = total - job.selected_entries
            delay = when - int(message.queued_time)
            if 0 < needed <= max_slots:
                score = delay / total
                if score > best_score:
                    best, best_score = job, score
            if delay <= best_score and job.stack_level == 0:
                self.stopped = True
                break
        self.best = best
        self.score = best_score

    def chunks(self, chunks: list[Chunk], start: int) -> None:
        """Walk ``chunks[start:]``, skipping quiet chunks; exact bounds for fully walked ones."""
        for i in range(start, len(chunks)):
            chunk = chunks[i]
            if self.quiet(chunk):
                continue
            self.scan(chunk.jobs, 0)
            if self.stopped:
                return
            _chunk_recompute(chunk)


def candidate_search(current: Job, now: int, max_slots: int | None = None) -> Job | None:
    """The job :func:`candidate_linear` would return, found through the transport's index."""
    if max_slots is None:
        max_slots = _max_slots(current)
    if max_slots <= 0:
        return None
    walk = _Walk(now + 1, max_slots, current.transport.blocker_tag)
    chunk = _chunk_of(current)
    if not walk.quiet(chunk):
        walk.scan(chunk.jobs, chunk.jobs.index(current) + 1)
        if walk.stopped:
            return walk.best
    group = chunk.group
    if not walk.quiet(group):
        walk.chunks(group.chunks, group.chunks.index(chunk) + 1)
        if walk.stopped:
            return walk.best
    index = group.index
    if walk.quiet(index):
        return walk.best
    groups = index.groups
    for i in range(groups.index(group) + 1, len(groups)):
        g = groups[i]
        if walk.quiet(g):
            continue
        walk.chunks(g.chunks, 0)
        if walk.stopped:
            return walk.best
        _group_recompute(g)
    _root_recompute(index)
    return walk.best


def index_check(index: JobIndex, job_list: list[Job]) -> None:
    """Raise InvariantError unless ``index`` holds ``job_list`` in order with valid bounds."""
    if index.jobs() != job_list or index.count != len(job_list):
        raise InvariantError("job index: order differs from job_list")
    for g in index.groups:
        if (
            index.min_needed > g.min_needed
            or index.min_total > g.min_total
            or index.min_qt > g.min_qt
            or index.max_qt0 < g.max_qt0
        ):
            raise InvariantError("job index: index bounds do not enclose a group's")
        if not g.chunks or g.index is not index or len(g.chunks) > GROUP_MAX:
            raise InvariantError("job index: empty or foreign group")
        for c in g.chunks:
            if not c.jobs or c.group is not g or len(c.jobs) > CHUNK_MAX:
                raise InvariantError("job index: bad chunk")
            if (  # index_touch relies on group bounds enclosing chunk bounds
                g.min_needed > c.min_needed
                or g.min_total > c.min_total
                or g.min_qt > c.min_qt
                or g.max_qt0 < c.max_qt0
            ):
                raise InvariantError("job index: group bounds do not enclose a chunk's")
            for node in (c, g, index):
                probe = Chunk(g)
                _merge_bounds(probe, node)
                for job in c.jobs:
                    if job.index_chunk is not c:
                        raise InvariantError("job index: stale chunk pointer")
                    _tighten(probe, job)
                if (
                    probe.min_needed != node.min_needed
                    or probe.min_total != node.min_total
                    or probe.min_qt != node.min_qt
                    or probe.max_qt0 != node.max_qt0
                ):
                    raise InvariantError(f"job index: bounds miss {job.describe()}")
