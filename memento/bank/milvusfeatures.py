"""The feature store of a Milvus bank (:mod:`memento.bank.milvus`): :class:`MilvusFeatures`, the usage log, the
evidence log, the action vectors and the cases' history in side collections of the bank's collection, created on
first write.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memento.bank.history import UPDATABLE, EventRow
from memento.bank.milvusconn import import_pymilvus
from memento.bank.milvusindex import declare_index
from memento.bank.milvusrows import (
    ACTIONS_SUFFIX,
    EVIDENCE_SUFFIX,
    HISTORY_FIELDS,
    HISTORY_SUFFIX,
    MAX_ID_BYTES,
    MAX_TEXT_BYTES,
    READ_CHUNK,
    USAGE_SUFFIX,
    MilvusRows,
)

__all__ = ["MilvusFeatures"]


class MilvusFeatures:
    """The case features of a Milvus bank, in two side collections created on first write (so a bank that
    never uses them is left as it was): ``<collection>__usage`` (an auto-id row per showing: ``step``, ``pos``,
    ``reward``, and a constant 2-d vector, as Milvus wants one in every collection) and
    ``<collection>__actions`` (primary key ``pos``, the action ``vector``)."""

    def __init__(self, rows: MilvusRows, dim: int):
        self._rows = rows
        self._dim = dim
        self.usage = f"{rows.collection}{USAGE_SUFFIX}"
        self.actions = f"{rows.collection}{ACTIONS_SUFFIX}"
        self.evidence = f"{rows.collection}{EVIDENCE_SUFFIX}"
        self.history = f"{rows.collection}{HISTORY_SUFFIX}"
        self.keep_values = False  # a forgotten case's history keeps its values (a bank opened with audit=True)
        self._have: dict[str, bool] = {}
        rows._forget_hook = self._remove

    def _remove(self, positions: Sequence[int] | None, beyond: int | None) -> None:
        """Delete the side rows of ``positions`` (and erase the values of their history unless ``keep_values``), or
        of every position ``>= beyond``."""
        listed = f"pos >= {int(beyond)}" if positions is None else \
            f"pos in [{', '.join(str(int(p)) for p in positions)}]"
        for name in (self.usage, self.actions, self.evidence):
            self._delete(name, listed)
        if positions is None:
            self._delete(self.history, listed)
        elif not self.keep_values:
            self._erase(listed)

    def _erase(self, expression: str) -> None:
        """Rewrite the history rows matching ``expression`` without their values (deleted, then inserted again:
        an auto-id collection takes no upsert; the order is by time)."""
        if not self._exists(self.history):
            return
        rows = self._rows.call("read", self._rows.client.query, self.history, filter=expression,
                               output_fields=list(HISTORY_FIELDS))
        values = [f"{side}_{name}" for side in ("old", "new") for name in UPDATABLE]
        kept = [{**{name: row.get(name) for name in HISTORY_FIELDS}, **dict.fromkeys(values), "vector": [1.0, 0.0]}
                for row in rows if any(row.get(name) is not None for name in values)]
        if not kept:
            return
        self._rows.call("delete", self._rows.client.delete, self.history,
                        filter=f"seq in [{', '.join(str(int(row['seq'])) for row in rows)}]")
        for row in kept:
            row.pop("seq", None)
        self._rows.call("insert", self._rows.client.insert, self.history, kept)

    def record_events(self, events: Sequence[EventRow]) -> None:
        if not events:
            return
        self._ensure(self.history)
        rows = [{**event.columns(), "vector": [1.0, 0.0]} for event in events]
        for row in rows:
            row["link"] = row["link"] or ""
        self._rows.call("insert", self._rows.client.insert, self.history, rows)

    def events_at(self, position: int) -> list[EventRow]:
        if not self._exists(self.history):
            return []
        rows = self._rows.call("read", self._rows.client.query, self.history, filter=f"pos == {int(position)}",
                               output_fields=list(HISTORY_FIELDS))
        rows.sort(key=lambda row: (float(row["time"]), int(row["seq"])))
        return [EventRow.from_columns(row) for row in rows]

    def drop_actions(self, positions: Sequence[int]) -> None:
        self._delete(self.actions, f"pos in [{', '.join(str(int(p)) for p in positions)}]")

    def _exists(self, name: str) -> bool:
        """Whether the side collection ``name`` exists (then loaded: a collection is searched once loaded)."""
        if not self._have.get(name):
            client = self._rows.client
            self._have[name] = bool(self._rows.call("read", client.has_collection, name))
            if self._have[name]:
                self._rows.call("load", declare_index, client, name, "FLAT", {}, lite_dir=self._rows.lite_dir,
                                label=f"{self._rows.name} ({name})", repair=not self._rows.read_only)
        return self._have[name]

    def _ensure(self, name: str) -> None:
        if self._exists(name):
            return
        pymilvus = import_pymilvus()  # created once, with its index, then loaded
        DataType = pymilvus.DataType
        usage = name in (self.usage, self.evidence)  # the per-step logs: an auto-id row each
        schema = pymilvus.MilvusClient.create_schema(auto_id=usage or name == self.history, enable_dynamic_field=False)
        if name == self.history:  # one auto-id row per event; values nullable (erased after a delete)
            schema.add_field("seq", DataType.INT64, is_primary=True)
            schema.add_field("pos", DataType.INT64)
            schema.add_field("event", DataType.VARCHAR, max_length=16)
            schema.add_field("time", DataType.DOUBLE)
            schema.add_field("version", DataType.INT64)
            schema.add_field("fields", DataType.VARCHAR, max_length=256)
            schema.add_field("link", DataType.VARCHAR, max_length=MAX_ID_BYTES)
            for side in ("old", "new"):
                schema.add_field(f"{side}_action", DataType.VARCHAR, max_length=MAX_TEXT_BYTES, nullable=True)
                schema.add_field(f"{side}_reward", DataType.DOUBLE, nullable=True)
                schema.add_field(f"{side}_meta", DataType.VARCHAR, max_length=MAX_TEXT_BYTES, nullable=True)
        elif usage:
            schema.add_field("seq", DataType.INT64, is_primary=True)
            schema.add_field("step", DataType.INT64)
            schema.add_field("pos", DataType.INT64)
            for column in (("reward",) if name == self.usage else ("weight", "value")):
                schema.add_field(column, DataType.DOUBLE)
        else:
            schema.add_field("pos", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2 if usage or name == self.history else self._dim)
        client = self._rows.client
        self._rows.call("create", client.create_collection, name, schema=schema, consistency_level="Strong")
        self._rows.call("create", declare_index, client, name, "FLAT", {})
        self._have[name] = True

    def record(self, step: int, positions_K: np.ndarray, reward: float) -> None:
        self._ensure(self.usage)
        rows = [{"step": step, "pos": int(p), "reward": reward, "vector": [1.0, 0.0]} for p in positions_K]
        self._rows.call("insert", self._rows.client.insert, self.usage, rows)

    def totals(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        shown_N = np.zeros(n, dtype=np.int64)
        reward_N = np.zeros(n, dtype=np.float64)
        if not self._exists(self.usage):
            return shown_N, reward_N
        batches = self._rows.call("read", self._rows.client.query_iterator, self.usage, batch_size=4096,
                                  filter=f"pos < {n}", output_fields=["pos", "reward"])
        try:
            while batch := self._rows.call("read", batches.next):
                positions = np.asarray([int(r["pos"]) for r in batch], dtype=np.int64)
                np.add.at(shown_N, positions, 1)
                np.add.at(reward_N, positions, np.asarray([float(r["reward"]) for r in batch]))
        finally:
            batches.close()
        return shown_N, reward_N

    def record_evidence(self, step: int, positions_M: np.ndarray, weight_M: np.ndarray, value_M: np.ndarray) -> None:
        self._ensure(self.evidence)
        rows = [{"step": step, "pos": int(p), "weight": float(w), "value": float(v), "vector": [1.0, 0.0]}
                for p, w, v in zip(positions_M, weight_M, value_M)]
        self._rows.call("insert", self._rows.client.insert, self.evidence, rows)

    def evidence_totals(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        count_N, weight_N, value_N = np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n)
        if not self._exists(self.evidence):
            return count_N, weight_N, value_N
        batches = self._rows.call("read", self._rows.client.query_iterator, self.evidence, batch_size=4096,
                                  filter=f"pos < {n}", output_fields=["pos", "weight", "value"])
        try:
            while batch := self._rows.call("read", batches.next):
                positions = np.asarray([int(r["pos"]) for r in batch], dtype=np.int64)
                np.add.at(count_N, positions, 1)
                np.add.at(weight_N, positions, np.asarray([float(r["weight"]) for r in batch]))
                np.add.at(value_N, positions, np.asarray([float(r["value"]) for r in batch]))
        finally:
            batches.close()
        return count_N, weight_N, value_N

    def _delete(self, name: str, expression: str) -> int:
        """Delete the rows of a side collection matching ``expression``; returns how many there were."""
        if not self._exists(name):
            return 0
        client = self._rows.client
        found = self._rows.call("count", client.query, name, filter=expression, output_fields=["count(*)"])
        count = int(found[0]["count(*)"]) if found else 0
        if count:
            self._rows.call("delete", client.delete, name, filter=expression)
        return count

    def truncate_steps(self, step: int) -> int:
        return sum(self._delete(name, f"step >= {int(step)}") for name in (self.usage, self.evidence))

    def forget(self, positions: Sequence[int]) -> None:
        """In a transaction, after its commit point (see :meth:`MilvusRows.transaction`)."""
        if not self._rows.defer_forget(positions):
            self._remove(positions, None)

    def truncate(self, n: int) -> None:
        for name in (self.usage, self.actions, self.evidence, self.history):
            self._delete(name, f"pos >= {n}")

    def actions_at(self, positions_C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        emb_CD = np.zeros((positions_C.size, self._dim), dtype=np.float32)
        have_C = np.zeros(positions_C.size, dtype=bool)
        if not positions_C.size or not self._exists(self.actions):
            return emb_CD, have_C
        unique = np.unique(positions_C).tolist()
        for start in range(0, len(unique), READ_CHUNK):
            for row in self._rows.call("read", self._rows.client.get, self.actions,
                                       ids=unique[start:start + READ_CHUNK], output_fields=["pos", "vector"]):
                rows = positions_C == int(row["pos"])
                emb_CD[rows], have_C[rows] = np.asarray(row["vector"], dtype=np.float32), True
        return emb_CD, have_C

    def set_actions(self, positions_C: np.ndarray, emb_CD: np.ndarray) -> None:
        self._ensure(self.actions)
        rows = [{"pos": int(p), "vector": np.ascontiguousarray(v, dtype=np.float32)}
                for p, v in zip(positions_C, emb_CD)]
        self._rows.call("upsert", self._rows.client.upsert, self.actions, rows)
