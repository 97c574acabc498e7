"""Write the bundled demo data: data/support_tickets.jsonl and data/support_answers.jsonl.

    uv run python scripts/make_demo_data.py [--out DIR]

Deterministic (fixed seed, no clock). Every ticket text here was written for this project; expected answers come
from ontologies/support.yaml. A *case* is one request (an intent, plus the order number the text names). Its first
ticket in file order is the original, a later one with new wording a paraphrase, an exact copy of an earlier text
a repeat. Intents get ticket counts on a Zipf curve (weight 1/rank).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from gil_core.language import ENGLISH
from gil_core.ontology import OptionKind, Tree, TreeLintWarning, load_tree

ROOT = Path(__file__).resolve().parents[1]
TREE_PATH = ROOT / "ontologies" / "support.yaml"
SEED = 1729
HABIT_TICKETS, WARRANTY_TICKETS, OUT_OF_SCOPE_TICKETS = 254, 16, 30
REPEAT_SHARE, PARAPHRASE_SHARE = 0.25, 0.30  # per intent; intents short of seeds add paraphrases (~35% in all)
# The canonical reply for the change-email procedure (documented in data/README.md).
CHANGE_EMAIL_ANSWER = (
    "To change your email, we first confirm your current address, then send a code to the new address; "
    "the account switches over once you enter that code."
)


class Intent(NamedTuple):
    option_id: str | None  # None: no habit answers it (warranty, out of scope)
    category: str  # node id; "root" when no category fits
    groups: tuple[tuple[str, ...], ...]  # per group: a seed text, then hand-written rewordings


class Ticket(NamedTuple):
    text: str
    answer: str
    option_id: str | None
    category: str
    case: str


# fmt: off
# Habits in Zipf rank order: the first is the most frequent. "{order}" marks an order number.
HABITS = (
    Intent("track-order", "shipping", (
        ("Where is my order {order}?", "Any news on order {order}? It still hasn't arrived.",
         "Can you tell me where order {order} is right now?"),
        ("I ordered a week ago and nothing has shown up yet. Order number is {order}.",
         "Been waiting a week for #{order}, still nothing at my door."),
        ("hi can u track {order} for me", "pls track order {order}", "were is my packge {order}"),
        ("Hello, I would like to know the current status of my order {order}. The website just says "
         "'processing' and I am starting to worry. Thank you.",
         "Status of order {order} please, the site has said processing for days."),
        ("order {order} where is it", "{order} - where is this parcel??"),
        ("My package for order {order} was supposed to come yesterday. Where is it now?",
         "Delivery for {order} was due yesterday and it's not here. What's going on?"),
        ("Has order {order} shipped yet?", "Did my order {order} leave the warehouse yet?"),
        ("The courier site shows nothing for order {order}. Can you check where it is?",))),
    Intent("reset-password", "security", (
        ("I forgot my password.", "Forgot my password, help", "I can't remember my password anymore."),
        ("I can't log in to my account, it keeps saying the password is wrong.",
         "Login fails every time with 'incorrect password' but I'm sure it's right."),
        ("How do I reset my password?", "how to reset password", "What are the steps to reset a password?"),
        ("Locked out of my account. Please help me get back in.", "I'm locked out, how do I get back into my account?"),
        ("I need a new password for my account.", "Please give me a new password"), ("cant sign in", "cant login"),
        ("I changed my password last month and now I have no idea what it is. How do I set a new one?",),
        ("My reset link says it has expired. What do I do?",
         "The password link you sent doesn't work anymore, it says expired."),
        ("Hi, I haven't used my account in ages and don't remember the password. Can I reset it myself?",),
        ("password reset pls", "pasword reset"))),
    Intent("refund-status", "billing", (
        ("Where is my refund?", "Still waiting for my refund.", "where's my refund??"),
        ("When will the refund show up on my card?", "How long until the refund hits my credit card?"),
        ("You approved my refund on Monday but my bank account still shows nothing. How long does it take?",),
        ("I cancelled my order and was told I'd be refunded. Nothing yet. When does the money come back?",),
        ("I returned order {order} two weeks ago and haven't seen the money back yet.",
         "Sent back order {order} a while ago, when do I get my money?"),
        ("refund status for {order}?", "What's the status of the refund on order {order}?"))),
    Intent("return-label", "returns", (
        ("Can I get a return label for order {order}?", "Please send me a return label for order {order}."),
        ("I need to send back the jacket from order {order}. Could you email me a shipping label?",
         "Want to return the jacket from {order}, need a label."),
        ("return label {order}", "label for returning #{order} pls"),
        ("Hello, the box in order {order} arrived damaged and I want to send it back. Where do I get a label?",),
        ("The return label for {order} wasn't in the package. Can you send one?",))),
    Intent("delivery-time", "shipping", (
        ("How long does delivery take?", "how many days for delivery", "How long will shipping take?"),
        ("If I order today, when will it arrive?", "Ordering now - when would it get here?"),
        ("I need a present by next week. How many days does standard shipping usually take?",),
        ("What's the usual delivery time to my area?",), ("delivery time?", "delivry time"))),
    Intent("invoice-copy", "billing", (
        ("Can you send me the invoice for order {order}?", "I need a copy of the invoice for order {order}."),
        ("My accountant needs an invoice for {order}. Could you send it please?",
         "Need the invoice of #{order} for my bookkeeping."),
        ("invoice {order}", "invoice for {order} pls"),
        ("I lost the receipt for order {order}, can I get another copy of the invoice?",))),
    Intent("return-policy", "returns", (
        ("What is your return policy?", "what's the returns policy", "Can you explain how returns work?"),
        ("Can I still return something I bought three weeks ago?",
         "Is it too late to return an item I got 3 weeks ago?"),
        ("How many days do I have to return an item?",),
        ("I opened the headphones but don't like them. Can they still be returned?",))),
    Intent("shipping-cost", "shipping", (
        ("How much is shipping?", "what does shipping cost", "How much do you charge for delivery?"),
        ("Is shipping free?", "Do you offer free shipping?"),
        ("My cart is at 42. What will delivery cost me?",), ("shipping fees?",))),
    Intent("change-email", "profile", (
        ("I want to change the email address on my account.", "How do I change my account email?"),
        ("change email",), ("Please update my email, I no longer use my old address.",
         "I don't use my old email anymore, can you switch the account to a new one?"),
        ("My work email is on the account and I'm leaving the company. Can I move it to my personal address?",))),
    Intent("payment-methods", "billing", (
        ("What payment methods do you accept?", "which payment options do you have"),
        ("Can I pay with a debit card?", "Do you take debit cards?"), ("Is paying by bank transfer possible?",))),
    Intent("two-factor", "security", (
        ("How do I turn on two-factor authentication?", "how to enable 2FA"),
        ("I'd like an extra security step when I log in. Is that possible?",),
        ("Where do I set up two-step verification?", "2fa setup?"))),
    Intent("close-account", "profile", (
        ("Please delete my account.", "I want my account deleted."),
        ("How do I close my account?", "how to close account"),
        ("I don't shop here anymore and want all my data gone. How do I cancel the account?",))),
)
WARRANTY = Intent(None, "warranty", (
    ("My coffee machine stopped working after four months. Is it covered by warranty?",
     "Coffee maker died after 4 months - warranty?"),
    ("How long is the warranty on your headphones?",), ("Do I need the receipt to make a warranty claim?",),
    ("The zipper on my backpack broke. Do you replace items like that?",),
    ("The tablet I bought in spring has a dead line across the screen. I'd like to make a warranty claim.",),
    ("The blender from order {order} broke after a few weeks. Can I get it repaired?",
     "Blender from {order} stopped working, can it be fixed under warranty?")))
OUT_OF_SCOPE = Intent(None, "root", (
    ("Do you sell gift cards?", "can i buy a gift card"), ("How do I check the balance on my gift card?",),
    ("What are your store opening hours?", "When is the shop open on Sundays?"),
    ("Are you hiring? I'd like to apply for a job in your warehouse.", "How can I apply for a job with you?"),
    ("Do you offer wholesale prices for shops?",), ("Will the blue running shoes be back in stock soon?",),
    ("I'm a blogger and would love to partner with your brand. Who should I contact?",),
    ("Do you price match other stores?",), ("Is there a physical store near the city centre?",),
    ("Can you recommend a good laptop for gaming?",)))
# fmt: on

GREETINGS = ("Hi, ", "Hello, ", "Hey there, ", "Good morning, ")
CLOSINGS = (" Thanks!", " Thank you in advance.", " Cheers", " Appreciate the help.", " Kind regards, Dana")


def _decap(text: str) -> str:
    return text if re.match(r"I\b", text) else text[:1].lower() + text[1:]


def _typo(text: str) -> str:
    """Swap two letters in the middle of the longest word (digits are never touched)."""
    words = re.findall(r"[A-Za-z]{5,}", text)
    if not words:
        return text
    word = max(words, key=len)
    i = len(word) // 2
    return text.replace(word, word[: i - 1] + word[i] + word[i - 1] + word[i + 1 :], 1)


def style_variants(text: str) -> list[str]:
    """Mechanical rewordings of one text: greetings, sign-offs, casual, a typo, context."""
    greeted = re.match(r"(hi|hello|hey|good)\b", text, re.IGNORECASE)
    out = [] if greeted else [g + _decap(text) for g in GREETINGS]
    out += [text + c for c in CLOSINGS]
    out += [text.lower().rstrip(".?!"), _typo(text), "Sorry to ask again. " + text]
    out += [text + " Please answer soon, it's urgent."] + ([] if greeted else ["Quick question: " + _decap(text)])
    return out


def zipf_counts(total: int, n: int) -> list[int]:
    """Split ``total`` over ``n`` ranks with weight 1/rank (largest remainder)."""
    raw = [total / r / sum(1 / k for k in range(1, n + 1)) for r in range(1, n + 1)]
    counts = [int(x) for x in raw]
    for i in sorted(range(n), key=lambda i: counts[i] - raw[i])[: total - sum(counts)]:
        counts[i] += 1
    return counts


def expected_answer(tree: Tree, option_id: str | None, order: str | None) -> str:
    if option_id is None:
        return ENGLISH.none_of_these
    option = tree.option(option_id)
    if option.kind is OptionKind.ANSWER:
        return str(option.text)
    if option.kind is OptionKind.PROCEDURE:
        assert option_id == "change-email", option_id
        return CHANGE_EMAIL_ANSWER
    values = {s.name: (s.fixed or "") if s.is_fixed else (order or "unknown") for s in option.slots}
    return str(option.template).format(**values)


def build_intent(
    intent: Intent, n: int, tree: Tree, rng: random.Random, seen: set[str], used: set[str]
) -> list[Ticket]:
    """``n`` tickets of one intent: ~45% new cases (fewer when it runs out of seeds), paraphrases, ~25% repeats."""
    n_repeat = round(n * REPEAT_SHARE)
    target = n - n_repeat - round(n * PARAPHRASE_SHARE)
    fixed = [g for g in intent.groups if "{order}" not in g[0]]
    numbered = [g for g in intent.groups if "{order}" in g[0]]
    cases: list[tuple[tuple[str, ...], str | None]] = [(g, None) for g in fixed[:target]]
    while numbered and len(cases) < target:
        digits = rng.choice((4, 5, 5))
        number = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
        if number not in used:
            used.add(number)
            cases.append((numbered[len(cases) % len(numbered)], number))
    category = intent.category
    assert intent.option_id is None or tree.owner(intent.option_id).id == category, intent
    tickets: list[Ticket] = []
    pools: list[list[str]] = []

    def emit(i: int, text: str) -> None:
        group, order = cases[i]
        assert text not in seen, f"text used twice: {text}"
        seen.add(text)
        key = f"{intent.option_id or category}/{intent.groups.index(group)}/{order or '-'}"
        tickets.append(Ticket(text, expected_answer(tree, intent.option_id, order), intent.option_id, category, key))

    for i, (group, order) in enumerate(cases):
        texts = [t.replace("{order}", order or "") for t in group]
        emit(i, texts[0])
        variants = [v for t in texts for v in style_variants(t)]
        rng.shuffle(variants)
        pools.append(texts[1:] + variants)  # hand-written rewordings first
    weights = [1 / (i + 1) for i in range(len(cases))]
    while len(tickets) < n - n_repeat:
        i = rng.choices(range(len(cases)), weights)[0]
        if fresh := [t for t in pools[i] if t not in seen]:
            emit(i, fresh[0])
        else:
            weights[i] = 0.0  # this case has no unused wording left
    tickets += rng.choices(tickets, [1 / (i + 1) for i in range(len(tickets))], k=n_repeat)
    return tickets


def build(tree: Tree) -> list[Ticket]:
    """All tickets in file order."""
    rng = random.Random(SEED)
    seen: set[str] = set()  # texts already written
    used: set[str] = set()  # order numbers already used
    plan = [*zip(HABITS, zipf_counts(HABIT_TICKETS, len(HABITS)), strict=True)]
    plan += [(WARRANTY, WARRANTY_TICKETS), (OUT_OF_SCOPE, OUT_OF_SCOPE_TICKETS)]
    tickets = [t for intent, n in plan for t in build_intent(intent, n, tree, rng, seen, used)]
    rng.shuffle(tickets)
    return tickets


def kinds(tickets: list[Ticket]) -> list[str]:
    """original / paraphrase / repeat for each ticket, in file order."""
    cases, texts, out = set(), set(), []
    for t in tickets:
        out.append("repeat" if t.text in texts else "paraphrase" if t.case in cases else "original")
        cases.add(t.case)
        texts.add(t.text)
    return out


def load_support_tree() -> Tree:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return load_tree(TREE_PATH)


def write(tickets: list[Ticket], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ticket_lines, answer_lines = [], []
    for n, t in enumerate(tickets, 1):
        ticket_lines.append(json.dumps({"id": f"t{n:04d}", "text": t.text}, ensure_ascii=False) + "\n")
        row = {"id": f"t{n:04d}", "answer": t.answer, "option_id": t.option_id, "category": t.category}
        answer_lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "support_tickets.jsonl").write_text("".join(ticket_lines), encoding="utf-8", newline="\n")
    (out / "support_answers.jsonl").write_text("".join(answer_lines), encoding="utf-8", newline="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data", help="output folder (default: data/)")
    args = parser.parse_args()
    tickets = build(load_support_tree())
    write(tickets, args.out)
    per_kind = {k: kinds(tickets).count(k) for k in ("original", "paraphrase", "repeat")}
    print(f"{len(tickets)} tickets -> {args.out}: {per_kind}")
    for name, count in Counter(t.option_id or f"none ({t.category})" for t in tickets).most_common():
        print(f"  {name:<20} {count}")


if __name__ == "__main__":
    main()
