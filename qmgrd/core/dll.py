"""Intrusive doubly linked lists (notes §2): O(1) append, insert, unlink and rotate.

Contract
--------
An object that sits on several lists owns one :class:`Link` per list (a job has one link for its
transport's scheduler-order list and one for its time-order list). A ``Link`` is on at most one
list at a time; linking a linked ``Link`` or unlinking a free one is a bug (``InvariantError``).

A link refers to its item and the item to its link: a cycle, which reference counting alone
cannot free. ``Link.release()`` breaks it when the item is disposed of (the link must be off every
list and is unusable afterwards), so the core's disposed objects are freed at once instead of
waiting for CPython's cyclic garbage collector.

``DList.rotate(link)`` is Postfix's round-robin primitive: make the list circular and cut it right
after ``link``, so ``link`` becomes the tail and its successor the head.

Iteration (``iter_links``/``__iter__``) reads the successor before yielding the current element,
so the caller may unlink the element it was just given (many Postfix loops rely on this).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from qmgrd.errors import InvariantError

__all__ = ["DList", "Link"]

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Link(Generic[T]):
    """One list membership of ``item``: its neighbours and the list that holds it."""

    item: T
    prev: Link[T] | None = None
    next: Link[T] | None = None
    owner: DList[T] | None = None

    def release(self) -> None:
        """Drop the reference to the disposed item (breaks the item-link cycle)."""
        if self.owner is not None:
            raise InvariantError("release: link is still on a list")
        del self.item


class DList(Generic[T]):
    """A doubly linked list of :class:`Link` nodes with a length counter."""

    __slots__ = ("count", "head", "tail")

    def __init__(self) -> None:
        """Create an empty list."""
        self.head: Link[T] | None = None
        self.tail: Link[T] | None = None
        self.count = 0

    def __len__(self) -> int:
        """Number of links on the list (O(1))."""
        return self.count

    def __bool__(self) -> bool:
        """True when the list is not empty."""
        return self.head is not None

    def _check_free(self, link: Link[T]) -> None:
        if link.owner is not None:
            raise InvariantError("link is already on a list")

    def append(self, link: Link[T]) -> None:
        """Put ``link`` at the tail."""
        if link.owner is not None:  # _check_free, inlined: the hottest list operation
            raise InvariantError("link is already on a list")
        link.owner = self
        link.next = None
        link.prev = self.tail
        if self.tail is None:
            self.head = link
        else:
            self.tail.next = link
        self.tail = link
        self.count += 1

    def prepend(self, link: Link[T]) -> None:
        """Put ``link`` at the head."""
        self._check_free(link)
        link.owner = self
        link.prev = None
        link.next = self.head
        if self.head is None:
            self.tail = link
        else:
            self.head.prev = link
        self.head = link
        self.count += 1

    def insert_after(self, link: Link[T], ref: Link[T] | None) -> None:
        """Put ``link`` right after ``ref``; ``ref`` None means at the head."""
        if ref is None:
            self.prepend(link)
            return
        if ref.owner is not self:
            raise InvariantError("insert_after: reference link is not on this list")
        self._check_free(link)
        link.owner = self
        nxt = ref.next
        link.prev = ref
        link.next = nxt
        ref.next = link
        if nxt is None:
            self.tail = link
        else:
            nxt.prev = link
        self.count += 1

    def insert_before(self, link: Link[T], ref: Link[T]) -> None:
        """Put ``link`` right before ``ref``."""
        if ref.owner is not self:
            raise InvariantError("insert_before: reference link is not on this list")
        self.insert_after(link, ref.prev)

    def unlink(self, link: Link[T]) -> None:
        """Take ``link`` off this list."""
        if link.owner is not self:
            raise InvariantError("unlink: link is not on this list")
        prev, nxt = link.prev, link.next
        if prev is None:
            self.head = nxt
        else:
            prev.next = nxt
        if nxt is None:
            self.tail = prev
        else:
            nxt.prev = prev
        link.prev = link.next = None
        link.owner = None
        self.count -= 1

    def rotate(self, link: Link[T]) -> None:
        """Round robin: ``link`` becomes the tail, its successor becomes the head."""
        if link.owner is not self:
            raise InvariantError("rotate: link is not on this list")
        if link is self.tail:
            return
        head, tail = self.head, self.tail
        assert head is not None and tail is not None  # non-empty: link is on it
        new_head = link.next
        assert new_head is not None  # link is not the tail
        tail.next = head
        head.prev = tail
        new_head.prev = None
        link.next = None
        self.head = new_head
        self.tail = link

    def iter_links(self) -> Iterator[Link[T]]:
        """Links from head to tail; the current one may be unlinked by the caller."""
        link = self.head
        while link is not None:
            nxt = link.next
            yield link
            link = nxt

    def __iter__(self) -> Iterator[T]:
        """Items from head to tail; the current one may be unlinked by the caller."""
        link = self.head
        while link is not None:
            nxt = link.next
            yield link.item
            link = nxt
