"""English Home Assistant intents as a seeded train/test split of sentences.

Source: the templates and closed slot lists of ``home-assistant-intents``
(2026.11.25), parsed with ``hassil`` (3.13). ``hassil.sample`` enumerates every
combination (millions for some intents) and skips wildcard templates, so the
sentences are drawn by a seeded random walk over each parsed template tree:

* for each intent (in sorted order) and each split, draw up to
  ``4 * target`` walks; each walk picks one (data block, sentence template)
  pair uniformly, then at every ``Alternative`` one branch uniformly (an
  optional ``[x]`` is an alternative with an empty branch), shuffles every
  ``Permutation``, expands ``<rules>`` and fills every ``{list}``;
* closed lists (colours, states, fan modes, cover classes, ...) take a
  uniformly chosen value from the package; number ranges a uniformly chosen
  number, written in digits (70%) or in words (30%, hassil's RBNF engine);
* the lists the package leaves to the installation (``area``, ``floor``,
  ``name`` per entity domain, and the wildcards ``message``, ``search_query``,
  ``zone``, ``timer_name``, ``timer_command``, ``shopping_list_item``,
  ``todo_list_item``) come from the fixed lists in this module, each split in
  a TRAIN part and a disjoint TEST part: test sentences name areas, floors,
  devices and items that training never saw;
* 10% of walks get one of the package's skip words ("please", "can you", ...)
  around them, as people say them;
* texts are lower-cased, whitespace-normalised and de-duplicated per split;
  a text produced under two labels is dropped from both splits (ambiguous),
  and a test text equal to a train text is dropped from the test split (so
  intents with only a handful of phrasings, such as HassNevermind, have few
  or no test sentences).

Targets: ``TRAIN_PER_INTENT`` = 900 and ``TEST_PER_INTENT`` = 420 unique texts
per intent, which gives 30,879 train and 13,739 test sentences over 40 labels
(hassil 3.13, home-assistant-intents 2026.11.25; generation takes ~6 s).
``SEED`` = 20261125 seeds one ``random.Random`` per (intent, split), so an
intent's sentences do not depend on the others.

Merged intents: ``HassShoppingListAddItem`` is textually a case of
``HassListAddItem`` ("add milk to my shopping list") and
``HassShoppingListCompleteItem`` of ``HassListCompleteItem``; they are merged
into those labels (``MERGED``), leaving 40 labels (``labels()``).

The split is cached in the user cache directory (``VSR_CACHE_DIR``, else
``~/.cache/vsr``) under a key that covers the seed, the targets, the package
versions and this file's source; it is never committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from vsr.runtime.paths import cache_root

SEED = 20261125
TRAIN_PER_INTENT = 900
TEST_PER_INTENT = 420
LANGUAGE = "en"

# Intents whose sentences cannot be told apart from another intent's: mapped
# onto the label that keeps them.
MERGED = {
    "HassShoppingListAddItem": "HassListAddItem",
    "HassShoppingListCompleteItem": "HassListCompleteItem",
}

# --- made-up installation lists: (train values, held-out test values) ------

AREAS = (
    ["kitchen", "living room", "bedroom", "bathroom", "garage", "office",
     "dining room", "hallway", "basement", "attic", "guest room", "laundry room",
     "porch", "patio", "nursery", "study", "master bedroom", "kids room",
     "front yard", "back yard"],
    ["den", "pantry", "sunroom", "workshop", "library", "playroom", "mudroom",
     "loft", "conservatory", "cellar", "balcony", "home gym"],
)
FLOORS = (
    ["first floor", "second floor", "ground floor", "upstairs", "downstairs"],
    ["third floor", "top floor", "lower level", "mezzanine"],
)

# Entity names per Home Assistant domain (the domains the templates name).
NAMES = {
    "light": (["ceiling light", "desk lamp", "floor lamp", "bedside lamp",
               "porch light", "reading light", "chandelier", "strip lights",
               "pendant light", "night light", "wall sconce", "spotlight"],
              ["lava lamp", "fairy lights", "track lighting", "torchiere",
               "under cabinet lights", "moon lamp"]),
    "switch": (["coffee maker", "kettle", "space heater", "christmas tree",
                "dehumidifier", "water heater", "fountain pump"],
               ["espresso machine", "heated blanket", "aquarium pump",
                "towel warmer"]),
    "fan": (["ceiling fan", "tower fan", "box fan", "exhaust fan",
             "desk fan", "attic fan"],
            ["pedestal fan", "air purifier", "bathroom vent"]),
    "cover": (["garage door", "front blinds", "roller shutter", "curtains",
               "skylight", "awning", "shades"],
              ["patio screen", "gate", "venetian blinds", "drapes"]),
    "valve": (["water valve", "sprinkler valve", "gas valve", "main valve"],
              ["irrigation valve", "pool valve"]),
    "lock": (["front door lock", "back door lock", "garage lock", "side gate lock",
              "deadbolt"],
             ["shed lock", "mailbox lock", "cellar door lock"]),
    "media_player": (["tv", "speaker", "soundbar", "stereo", "radio",
                      "kitchen display", "bedroom speaker", "chromecast"],
                     ["record player", "home theater", "sonos", "projector",
                      "boombox"]),
    "climate": (["thermostat", "heat pump", "air conditioner", "radiator",
                 "boiler"],
                ["mini split", "heater", "floor heating"]),
    "binary_sensor": (["front door sensor", "window sensor", "motion sensor",
                       "smoke detector", "leak sensor", "garage sensor"],
                      ["doorbell sensor", "occupancy sensor", "gate sensor"]),
    "sensor": (["outdoor temperature", "humidity", "power usage",
                "air quality", "battery level"],
               ["pool temperature", "rain gauge", "solar output"]),
    "input_boolean": (["guest mode", "vacation mode", "party mode"],
                      ["quiet mode", "holiday mode"]),
    "todo": (["shopping", "grocery", "to do", "chores", "packing"],
             ["hardware store", "errands", "wish"]),
    "vacuum": (["roomba", "robot vacuum", "vacuum", "robot"],
               ["dustbot", "mopping robot"]),
    "lawn_mower": (["lawn mower", "mower", "robot mower"],
                   ["grass cutter", "automower"]),
    "person": (["alice", "bob", "mom", "dad", "grandma", "emma"],
               ["oliver", "sophia", "uncle joe"]),
    "scene": (["movie night", "dinner", "good morning", "relax", "bedtime"],
              ["romantic", "reading time", "sunrise"]),
    "script": (["morning routine", "goodnight", "leave home"],
               ["arrive home", "feed the fish"]),
    "button": (["doorbell", "restart router", "garage opener"],
               ["panic button", "reboot server"]),
    "input_button": (["reset counter", "refresh"], ["snooze", "sync clock"]),
    "weather": (["forecast", "home weather", "weather station"],
                ["local weather", "met office"]),
}
# Used where a template's data block names no domain (none do today).
GENERIC_NAMES = (["device", "outlet", "smart plug"], ["gadget", "power strip"])

WILDCARDS = {
    "message": (["dinner is ready", "time to go", "the movie starts soon",
                 "please come downstairs", "the laundry is done",
                 "we are leaving in five minutes", "wake up everyone",
                 "the guests are here", "lights out", "happy birthday"],
                ["the pizza has arrived", "bath time", "the car is outside",
                 "homework time", "the game is on"]),
    "search_query": (["the beatles", "jazz classics", "taylor swift",
                      "bohemian rhapsody", "morning news", "lofi beats",
                      "the daily", "miles davis", "abbey road",
                      "relaxing piano", "top hits", "harry potter audiobook"],
                     ["pink floyd", "dark side of the moon", "radiolab",
                      "beethoven symphonies", "road trip mix", "adele"]),
    "zone": (["home", "work", "school", "the gym", "the office"],
             ["the airport", "grandma's house", "the park"]),
    "timer_name": (["pizza", "eggs", "pasta", "laundry", "nap", "tea",
                    "cookies", "oven"],
                   ["bagels", "homework", "steak", "risotto"]),
    "timer_command": (["turn off the lights", "turn on the fan",
                       "close the blinds", "pause the tv"],
                      ["lock the door", "feed the cat"]),
    "shopping_list_item": (["milk", "eggs", "bread", "apples", "coffee",
                            "bananas", "cheese", "butter", "rice",
                            "toilet paper", "dish soap", "orange juice"],
                           ["avocados", "olive oil", "paper towels",
                            "yogurt", "cereal", "batteries"]),
}
WILDCARDS["todo_list_item"] = (
    WILDCARDS["shopping_list_item"][0] + ["call the plumber", "pay rent",
                                          "water the plants", "walk the dog"],
    WILDCARDS["shopping_list_item"][1] + ["book the dentist", "renew passport",
                                          "clean the gutters"],
)

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Example:
    text: str
    label: str


def _load_intents():
    import home_assistant_intents
    from hassil.intents import Intents

    data = home_assistant_intents.get_intents(LANGUAGE)
    if data is None:
        raise RuntimeError(f"home-assistant-intents has no {LANGUAGE!r} intents")
    return data, Intents.from_dict(data)


def labels() -> list[str]:
    """The 40 labels, sorted: the package's English intents minus MERGED."""
    _, intents = _load_intents()
    return sorted(n for n in intents.intents if n not in MERGED)


class _Walker:
    """One seeded random walk per call to ``sentence``."""

    def __init__(self, intents, split: int, rng: random.Random, skip_words):
        from hassil.numbers import get_rbnf_engine

        self.intents = intents
        self.split = split
        self.rng = rng
        self.skip_words = skip_words
        self.engine = get_rbnf_engine(LANGUAGE)
        self._words: dict = {}

    def _pick(self, values):
        return values[self.rng.randrange(len(values))]

    def _number_words(self, n) -> list[str]:
        if n not in self._words:
            fmt = self.engine.format_number(n)
            self._words[n] = sorted(set(fmt.text_by_ruleset.values()))
        return self._words[n]

    def _list(self, ref, domains) -> str:
        from hassil.intents import RangeSlotList, TextSlotList

        name = ref.list_name
        if name == "area":
            return self._pick(AREAS[self.split])
        if name == "floor":
            return self._pick(FLOORS[self.split])
        if name == "name":
            known = [d for d in domains if d in NAMES]
            pool = NAMES[self._pick(known)] if known else GENERIC_NAMES
            return self._pick(pool[self.split])
        if name in WILDCARDS:
            return self._pick(WILDCARDS[name][self.split])
        slot_list = self.intents.slot_lists.get(name)
        if isinstance(slot_list, TextSlotList):
            value = self._pick(slot_list.values)
            return self._walk(value.text_in, domains)
        if isinstance(slot_list, RangeSlotList):
            numbers = list(slot_list.get_numbers())
            n = self._pick(numbers)
            if slot_list.words and (not slot_list.digits or self.rng.random() < 0.3):
                return self._pick(self._number_words(n))
            return str(n)
        raise KeyError(f"slot list {{{name}}} has no values (add it to intents.py)")

    def _walk(self, expr, domains) -> str:
        from hassil.expression import (Alternative, ListReference, Permutation,
                                       RuleReference, Sequence, TextChunk)

        if isinstance(expr, TextChunk):
            return expr.original_text
        if isinstance(expr, Alternative):
            return self._walk(self._pick(expr.items), domains)
        if isinstance(expr, Permutation):
            items = list(expr.items)
            self.rng.shuffle(items)
            return " ".join(self._walk(i, domains) for i in items)
        if isinstance(expr, Sequence):
            return "".join(self._walk(i, domains) for i in expr.items)
        if isinstance(expr, ListReference):
            return self._list(expr, domains)
        if isinstance(expr, RuleReference):
            return self._walk(self.rules[expr.rule_name].expression, domains)
        raise TypeError(f"unexpected hassil expression {type(expr).__name__}")

    def sentence(self, templates) -> str:
        data, sentence = self._pick(templates)
        self.rules = {**self.intents.expansion_rules, **data.expansion_rules}
        text = self._walk(sentence.expression, sorted(data.domains))
        if self.rng.random() < 0.1:
            word = self._pick(self.skip_words)
            text = f"{text} {word}" if word == "for me" else f"{word} {text}"
        return " ".join(text.lower().split())


def _generate() -> dict[str, list[Example]]:
    raw, intents = _load_intents()
    skip_words = sorted(raw.get("skip_words", []))
    per_split: list[dict[str, str | None]] = [{}, {}]  # text -> label (None: ambiguous)
    order: list[list[str]] = [[], []]
    targets = (TRAIN_PER_INTENT, TEST_PER_INTENT)
    for name in sorted(intents.intents):
        label = MERGED.get(name, name)
        templates = [(d, s) for d in intents.intents[name].data for s in d.sentences]
        for split in (0, 1):
            seed = int.from_bytes(hashlib.sha256(f"{SEED}/{name}/{split}".encode()).digest()[:8], "big")
            walker = _Walker(intents, split, random.Random(seed), skip_words)
            seen: set[str] = set()
            for _ in range(4 * targets[split]):
                if len(seen) >= targets[split]:
                    break
                text = walker.sentence(templates)
                if not text or text in seen:
                    continue
                seen.add(text)
                owner = per_split[split].get(text, label)
                if text not in per_split[split]:
                    order[split].append(text)
                per_split[split][text] = label if owner == label else None
    # A text under two labels (in either split) is ambiguous: drop it everywhere.
    ambiguous = {t for m in per_split for t, lab in m.items() if lab is None}
    for t in set(per_split[0]) & set(per_split[1]):
        if per_split[0][t] != per_split[1][t]:
            ambiguous.add(t)
    out = {}
    for split, split_name in enumerate(SPLITS):
        out[split_name] = [
            Example(t, per_split[split][t]) for t in order[split]
            if t not in ambiguous and not (split == 1 and t in per_split[0])
        ]
    return out


def split_key() -> str:
    """The split's cache key: this file's source and the package versions it is generated from."""
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    for dist in ("home-assistant-intents", "hassil"):
        h.update(f"{dist}=={metadata.version(dist)}".encode())
    return h.hexdigest()[:16]


def load_split(*, use_cache: bool = True) -> dict[str, list[Example]]:
    """{"train": [...], "test": [...]}: the seeded split, generated once and cached."""
    path = cache_root() / "intents" / f"split-{split_key()}.json"
    if use_cache and path.is_file():
        raw = json.loads(path.read_text())
        return {s: [Example(t, lab) for t, lab in raw[s]] for s in SPLITS}
    split = _generate()
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({s: [[e.text, e.label] for e in split[s]] for s in SPLITS}))
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    return split


def held_out_values() -> dict[str, list[str]]:
    """The TEST-only values of every made-up list (for tests and reports)."""
    out = {"area": AREAS[1], "floor": FLOORS[1]}
    for dom, (_, test) in NAMES.items():
        out[f"name:{dom}"] = test
    for name, (_, test) in WILDCARDS.items():
        out[name] = test
    return out
