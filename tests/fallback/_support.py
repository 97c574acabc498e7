"""What the fallback tests share: a small tree with every kind of habit, and an in-memory call sink."""

from __future__ import annotations

from collections.abc import Sequence

from gil_core.llm import CallRecorder, ChatModel
from gil_core.ontology import Tree, parse_tree
from gil_core.telemetry import CallRecord, EnergyModel

TREE_YAML = """\
id: root
children:
  - id: billing
    description: charges and refunds
    options:
      - id: refund-status
        description: asks where a refund is
        text: Refunds arrive within 5 business days.
      - id: invoice-copy
        kind: template
        description: wants an invoice
        template: "The invoice for order {order} was sent to {inbox}."
        slots:
          - name: order
            instruction: the order number, or "unknown"
          - name: inbox
            instruction: fixed
            fixed: your account email
      - id: payment-methods
        text: We accept cards and bank transfer.
  - id: returns
    description: sending an item back
    options:
      - id: return-label
        kind: template
        description: wants a return label
        template: "A return label for order {order} is attached; print it and drop the parcel off."
        slots:
          - name: order
            instruction: the order number in the request, or "unknown"
      - id: return-window
        description: asks until when an item can be returned
        text: Items can be returned within 30 days.
      - id: damaged-item
        kind: procedure
        description: the item arrived broken
        steps: "1. Apologise. 2. Ask for a photo of the damage. 3. Promise a replacement."
"""


def small_tree() -> Tree:
    return parse_tree(TREE_YAML, source="tests/fallback")


class ListSink:
    """Keeps recorded calls in memory; the store-backed path is tested in tests/telemetry."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        self.calls.extend(calls)


def recorded(model: ChatModel) -> tuple[CallRecorder, ListSink]:
    """``model`` behind a recorder that prices each call at its tokens."""
    sink = ListSink()
    return CallRecorder(model, sink=sink, energy=EnergyModel.tokens()), sink
