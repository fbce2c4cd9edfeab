"""The `ragen` command line: `ragen envs`, `ragen play TAG --seed S`."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from ragen.envs import ENVS, LayoutError, make_env


def cmd_envs(args: argparse.Namespace, out: TextIO) -> int:
    width = max(map(len, ENVS))
    for tag in ENVS:
        print(f"{tag:<{width}}  {make_env(tag).description}", file=out)
    return 0


def cmd_play(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    if args.tag not in ENVS:
        print(f"ragen play: unknown env tag {args.tag!r}; known tags: {', '.join(ENVS)}", file=sys.stderr)
        return 2
    env = make_env(args.tag)
    options = None
    if args.layout:
        try:
            with open(args.layout, encoding="utf-8") as handle:
                options = {"layout": handle.read()}
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            print(f"ragen play: --layout {args.layout}: {reason}", file=sys.stderr)
            return 2
    try:
        obs, _ = env.reset(seed=args.seed, options=options)
    except (LayoutError, ValueError) as error:
        print(f"ragen play: {error}", file=sys.stderr)
        return 2
    if env.instruction:
        print(env.instruction, file=out)
    actions = ", ".join(env.action_names) if env.action_names else "an arithmetic expression"
    print(f"\n{env.tag}, seed {args.seed}. Actions: {actions}. Type 'quit' to stop.\n\n{obs}", file=out)
    total, steps = 0.0, 0
    while True:
        print("action> ", end="", file=out, flush=True)
        line = inp.readline()
        if not line or line.strip().lower() in ("quit", "exit", "q"):
            print(f"\nstopped after {steps} actions, return {total:g}", file=out)
            return 0
        obs, reward, terminated, truncated, info = env.step(line.strip())
        if not info["action_is_valid"]:
            print(f"not an action: {line.strip()[:80]!r} (actions: {actions})", file=out)
            continue
        steps += 1
        total += reward
        moved = "" if info["action_is_effective"] else " (no effect)"
        print(f"\n{obs}\nreward {reward:g}{moved} | return {total:g} | step {steps}", file=out)
        if terminated or truncated:
            outcome = "success" if info["success"] else "failure"
            end = "terminated" if terminated else "truncated"
            print(f"\nepisode {end}: {outcome}, {steps} actions, return {total:g}", file=out)
            return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragen", description="RAGEN / StarPO(-S) experiment platform")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("envs", help="list the environment tags, one line each")
    play = sub.add_parser("play", help="play an environment by hand in the terminal")
    play.add_argument("tag", help="environment tag (see `ragen envs`)")
    play.add_argument("--seed", type=int, default=0, help="instance seed (same seed, same episode)")
    play.add_argument("--layout", help="file with a fixed layout in the env's own symbols (sokoban, frozen_lake) "
                      "or a countdown puzzle ('Target: 24, nums: [2, 3, 4]')")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "envs":
        return cmd_envs(args, sys.stdout)
    return cmd_play(args, sys.stdout, sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
