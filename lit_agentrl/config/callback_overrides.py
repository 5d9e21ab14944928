"""``--trainer.callbacks.<N>.<key> VALUE`` on the command line: one argument of one callback in the config's list.

jsonargparse reaches a list's entries only as "the last one" (``--trainer.callbacks.init_args.KEY VALUE``, or
``--trainer.callbacks+=Class`` to append one), so a config whose RolloutCallback is not last had no way to change it
from the command line. Here an entry is picked by its index (from 0) or by its class name
(``--trainer.callbacks.RolloutCallback.train.n_samples 4``); ``init_args.`` before the key is optional. The value is parsed
and checked by jsonargparse against the callback's own signature, as in a config file. These overrides apply after
the rest of the command line (every ``--config`` included), in the order given.
"""

from __future__ import annotations

import json
import re
from argparse import ArgumentError
from dataclasses import dataclass
from typing import Any

from lit_agentrl.errors import UserInputError

# An index or a class name (capitalised, so jsonargparse's own `--trainer.callbacks.init_args.KEY` is not taken).
_ITEM = re.compile(r"^--trainer\.callbacks\.(\d+|[A-Z]\w*)\.([\w.]+)$")


@dataclass(frozen=True)
class ItemOverride:
    """One ``--trainer.callbacks.<selector>.<key> VALUE`` of the command line."""

    arg: str
    selector: str
    key: str
    value: str


def split_item_overrides(args: list[str]) -> tuple[list[str], list[ItemOverride]]:
    """The command line without its list-entry overrides, and those overrides (``--K V`` or ``--K=V``)."""
    rest: list[str] = []
    overrides: list[ItemOverride] = []
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        match = _ITEM.match(name)
        if match is None:
            rest.append(args[i])
            i += 1
            continue
        if not sep:
            if i + 1 >= len(args):
                raise UserInputError(f"{name} needs a value")
            value, i = args[i + 1], i + 1
        key = match.group(2).removeprefix("init_args.")
        overrides.append(ItemOverride(name, match.group(1), key, value))
        i += 1
    return rest, overrides


def apply_item_overrides(config: Any, overrides: list[ItemOverride]) -> None:
    """Set each override on its entry of ``config``'s ``trainer.callbacks`` (a parsed namespace), in place."""
    for override in overrides:
        entries = list(config.get("trainer.callbacks") or [])
        index = _entry_index(entries, override)
        entries[index] = _with_override(entries[index], override)
        config["trainer.callbacks"] = entries


def _entry_index(entries: list[Any], override: ItemOverride) -> int:
    names = [str(entry["class_path"]).rsplit(".", 1)[-1] for entry in entries]
    held = f"trainer.callbacks holds {names}" if names else "trainer.callbacks is empty"
    if override.selector.isdigit():
        index = int(override.selector)
        if index >= len(entries):
            raise UserInputError(f"{override.arg}: no entry {index}; {held} (counted from 0)")
        return index
    found = [i for i, name in enumerate(names) if name == override.selector]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} entries of class"
        raise UserInputError(f"{override.arg}: {what} {override.selector} in the list; {held}", hint=_INDEX_HINT)
    return found[0]


_INDEX_HINT = "pick the entry by its index, from 0: --trainer.callbacks.0.KEY VALUE"


def _with_override(entry: Any, override: ItemOverride) -> Any:
    """``entry`` with the override, parsed by jsonargparse against the callback's signature."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch import Callback

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--entry", type=Callback)
    try:
        parsed = parser.parse_args(["--entry", json.dumps(entry.as_dict()), f"--entry.{override.key}", override.value])
    except ArgumentError as exc:
        message = " ".join(str(exc).split())
        raise UserInputError(f"{override.arg} {override.value!r}: {message}") from None
    return parsed.entry
