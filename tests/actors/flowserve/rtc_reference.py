"""A deliberately naive reference model of the RTC's block pool, for the state-machine tests.

Plain lists scanned linearly (the LRU is a list, least recently used first), no index nodes:
where each chain hash lives is two dicts. It implements the same policy as the RTC (free blocks
before cached ones, LRU-front eviction, tail-first release, swapped-out blocks evicted first) so
that the block ids it picks must equal the RTC's, and its matches must equal the RTC's.
"""

from __future__ import annotations


class RefPool:
    def __init__(self, hbm: int, dram: int) -> None:
        self.hbm, self.dram = hbm, dram
        self.free = list(range(hbm - 1, -1, -1))
        self.lru: list[int] = []
        self.ref = [0] * hbm
        self.content: dict[int, int] = {}  # HBM block -> chain hash
        self.where_hbm: dict[int, int] = {}  # chain hash -> HBM block
        self.dfree = list(range(dram - 1, -1, -1))
        self.dlru: list[int] = []
        self.pins = [0] * dram
        self.dcontent: dict[int, int] = {}
        self.where_dram: dict[int, int] = {}
        self.parent: dict[int, int | None] = {}
        self.tables: dict[str, list[int]] = {}
        self.cached: dict[str, int] = {}
        self.loading: dict[str, int] = {}
        self.caches: dict[str, list[int]] = {}
        self.copies: dict[str, tuple] = {}

    # ---- helpers ----
    def _drop_node_if_empty(self, h: int) -> None:
        if h not in self.where_hbm and h not in self.where_dram:
            del self.parent[h]

    def inc(self, b: int) -> None:
        if self.ref[b] == 0:
            self.lru.remove(b)
        self.ref[b] += 1

    def dec(self, b: int, cold: bool = False) -> None:
        self.ref[b] -= 1
        assert self.ref[b] >= 0
        if self.ref[b] == 0:
            if b in self.content:
                self.lru.insert(0, b) if cold else self.lru.append(b)
            else:
                self.free.append(b)

    def take(self, n: int, skip: tuple[int, ...] = ()) -> tuple[list[int], list[int]]:
        picked, evicted = [], []
        while len(picked) < n and self.free:
            picked.append(self.free.pop())
        for b in [b for b in self.lru if b not in skip][: n - len(picked)]:
            self.lru.remove(b)
            h = self.content.pop(b)
            del self.where_hbm[h]
            self._drop_node_if_empty(h)
            picked.append(b)
            evicted.append(h)
        assert len(picked) == n
        for b in picked:
            self.ref[b] = 1
        return picked, evicted

    def take_dram(self, n: int) -> tuple[list[int], list[int]]:
        picked, evicted = [], []
        while len(picked) < n and self.dfree:
            picked.append(self.dfree.pop())
        while len(picked) < n:
            d = self.dlru.pop(0)
            h = self.dcontent.pop(d)
            del self.where_dram[h]
            self._drop_node_if_empty(h)
            picked.append(d)
            evicted.append(h)
        for d in picked:
            self.pins[d] = 1
        return picked, evicted

    def pin(self, d: int) -> None:
        if self.pins[d] == 0:
            self.dlru.remove(d)
        self.pins[d] += 1

    def unpin(self, d: int) -> None:
        self.pins[d] -= 1
        if self.pins[d] == 0:
            (self.dlru if d in self.dcontent else self.dfree).append(d)

    def index_hbm(self, h: int, parent: int | None, b: int) -> None:
        self.parent.setdefault(h, parent)
        self.where_hbm[h] = b
        self.content[b] = h

    # ---- operations ----
    def available(self) -> int:
        return len(self.free) + len(self.lru)

    def match(self, chain: list[int]) -> tuple[list[int], list[int]]:
        hbm, dram, i = [], [], 0
        while i < len(chain) and chain[i] in self.where_hbm:
            hbm.append(self.where_hbm[chain[i]])
            i += 1
        while self.dram and i < len(chain) and chain[i] in self.where_dram:
            dram.append(self.where_dram[chain[i]])
            i += 1
        return hbm, dram

    def allocate(self, seq: str, n: int, shared: tuple[int, ...]) -> tuple[list[int], list[int]]:
        table = self.tables.setdefault(seq, [])
        for b in shared:
            self.inc(b)
            table.append(b)
        if shared:
            self.cached[seq] = len(table)
        picked, evicted = self.take(n)
        table.extend(picked)
        return picked, evicted

    def cache(self, seq: str, chain: list[int]) -> list[int]:
        table, stored = self.tables[seq], []
        start, upto = self.cached.get(seq, 0), min(len(chain), len(self.tables[seq]))
        for i in range(start, upto):
            if chain[i] not in self.where_hbm:
                self.index_hbm(chain[i], chain[i - 1] if i else None, table[i])
                stored.append(chain[i])
        self.cached[seq] = max(start, upto)
        return stored

    def release(self, seq: str) -> None:
        for cid, (kind, s, *rest) in list(self.copies.items()):
            if s == seq:  # its copies no longer fill a table
                self.copies[cid] = (kind, None, *rest)
        for b in reversed(self.tables.pop(seq)):
            self.dec(b)
        self.cached.pop(seq, None)
        self.loading.pop(seq, None)

    def swap_out(self, cid: str, hashes: list[int]) -> list[int]:
        todo: list[int] = []
        for h in hashes:
            if h in self.where_hbm and h not in self.where_dram and h not in todo:
                todo.append(h)
        todo = todo[: len(self.dfree) + len(self.dlru)]
        if not todo:
            return []
        blocks = [self.where_hbm[h] for h in todo]
        for b in blocks:
            self.inc(b)
        dram, _ = self.take_dram(len(todo))
        self.copies[cid] = ("out", None, todo, blocks, dram)
        return todo

    def populate(self, cid: str, seq: str | None, chain: list[int]) -> list[int]:
        hbm_run, dram_run = self.match(chain)
        if not dram_run:
            return []
        for d in dram_run:
            self.pin(d)
        if seq is not None:
            table = self.tables.setdefault(seq, [])
            for b in hbm_run:
                self.inc(b)
                table.append(b)
        picked, _ = self.take(len(dram_run), tuple(hbm_run))
        if seq is not None:
            for b in picked:
                self.ref[b] += 1
                table.append(b)
            self.loading[seq] = self.loading.get(seq, 0) + 1
            self.cached[seq] = len(table)
        a = len(hbm_run)
        hashes = chain[a : a + len(dram_run)]
        self.copies[cid] = ("in", seq, hashes, picked, dram_run)
        for h in hashes:
            self.parent.setdefault(h, None)
        return picked

    def plan_prefetch(self, cid: str, queued: list[list[int]], min_free: float) -> list[int] | None:
        """Load the first queued prompt's DRAM run that fits in never-used free blocks above the
        floor; never evicts."""
        room = len(self.free) - int(min_free * self.hbm)
        for chain in queued:
            if room <= 0:
                return None
            _, dram = self.match(chain)
            if dram and len(dram) <= room:
                return self.populate(cid, None, chain)
        return None

    def finish(self, cid: str, ok: bool) -> None:
        kind, seq, hashes, blocks, dram = self.copies.pop(cid)
        if kind == "out":
            for h, b, d in reversed(list(zip(hashes, blocks, dram, strict=True))):
                if ok and h not in self.where_dram:
                    self.where_dram[h] = d
                    self.dcontent[d] = h
                self.unpin(d)
                self.dec(b, cold=ok)
            return
        alive = seq is not None
        if alive:
            self.loading[seq] -= 1
        for h, b, d in zip(hashes, blocks, dram, strict=True):
            if ok and h not in self.where_hbm:
                self.index_hbm(h, self.parent[h], b)
            self.unpin(d)
        if not ok and alive:
            table = self.tables[seq]
            keep = len(table) - len(blocks)
            for b in reversed(table[keep:]):
                self.dec(b)
            del table[keep:]
            self.cached[seq] = keep
        for b in blocks:
            self.dec(b)

    def create_cache(self, cid: str, seq: str, chain: list[int]) -> None:
        n = min(len(chain), self.cached.get(seq, 0))
        blocks = self.tables[seq][:n]
        for b in blocks:
            self.inc(b)
        self.caches[cid] = blocks

    def delete_cache(self, cid: str) -> None:
        for b in reversed(self.caches.pop(cid)):
            self.dec(b)
