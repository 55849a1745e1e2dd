"""The audit commands of the ``tidal`` CLI: ``verify`` (manifests and signatures of committed steps) and
``lineage`` (what a step was made from). :mod:`tidal.cli` parses their arguments and calls these."""

from __future__ import annotations

import argparse
import json
import sys

from tidal.audit.ancestry import TargetError, build_lineage, format_lineage, nothing_committed, resolve_target
from tidal.audit.verify import format_verification, verify_steps
from tidal.integrity.signing import SigningKeyError, load_key
from tidal.tracking import TrackingUnavailable


def verify(args: argparse.Namespace) -> int:
    """``tidal verify TARGET``: check every committed step of a step, recipe or run against its manifest (and
    signature); exit 0 all verified, 1 a mismatch or nothing committed, 2 a target that names nothing."""
    try:
        key = load_key()
        target = resolve_target(args.target, recipe=args.recipe, storage_root=args.storage_root)
    except (TargetError, SigningKeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    ids = list(target.steps.values()) if target.steps else target.final
    # one named step is verified even without _SUCCESS (a mismatch then); a recipe or run: its committed steps
    check = ids if target.kind == "step" else [sid for sid in ids if target.storage.is_committed(sid)]
    waiting = [sid for sid in ids if sid not in check]
    # with a key configured a step must carry a signature this key checks, unless --allow-unsigned
    require = args.require_signature or (key is not None and not args.allow_unsigned)
    results = verify_steps(target.storage, check, key, require)
    if args.json:
        print(json.dumps({"steps": [r.as_dict() for r in results], "not_committed": waiting}, indent=1))
    else:
        print(format_verification(results, waiting))
    if not results:
        print(f"error: {nothing_committed(target)}", file=sys.stderr)
        return 1
    failed = sum(not r.ok for r in results)
    if failed:
        print(f"error: {failed} of {len(results)} step(s) failed verification", file=sys.stderr)
    return 1 if failed else 0


def lineage(args: argparse.Namespace) -> int:
    """``tidal lineage TARGET``: the ancestry of a step, recipe or run (JSON with ``--json``); exit 0, 1 when
    nothing is committed, 2 a target that names nothing."""
    note = None
    try:
        target = resolve_target(args.target, recipe=args.recipe, storage_root=args.storage_root)
    except TargetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except TrackingUnavailable as err:  # a run key's steps are in MLflow: without it, the recipe's
        if not args.recipe:
            print(f"error: {args.target}: no step id under the storage root, and no MLflow run key could be "
                  f"looked up: {err}", file=sys.stderr)
            return 1
        note = f"{err}; run key {args.target} not looked up: showing the steps {args.recipe} plans now"
        target = resolve_target(args.recipe, storage_root=args.storage_root)
    found = build_lineage(target)
    if note:
        found["tracking_error"] = note
    print(json.dumps(found, indent=1, sort_keys=True) if args.json else format_lineage(found))
    if note:
        print(f"warning: {note}", file=sys.stderr)
    if not any(step["committed"] for step in found["steps"]):
        print(f"error: {nothing_committed(target)}", file=sys.stderr)
        return 1
    return 0
