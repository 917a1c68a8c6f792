"""``python -m shared.spec [--check]``: write (or, with --check, compare) the generated files:
``shared/spec/mechanisms.json``, ``web_edge/src/generated/spec.ts``,
``web_edge/src/generated/public_text.ts`` and ``web_edge/src/random/ziggurat_tables.ts``. Exit code 1 and the stale files named under --check."""

from __future__ import annotations

import sys
from pathlib import Path

from shared.floor_text import SAMPLE_FILE
from shared.spec import SPEC_FILE, build, dumps, typescript, ziggurat

REPO = Path(__file__).resolve().parents[2]
SPEC_TS = REPO / "web_edge" / "src" / "generated" / "spec.ts"
ZIGGURAT_TS = REPO / "web_edge" / "src" / "random" / "ziggurat_tables.ts"
PUBLIC_TEXT_TS = REPO / "web_edge" / "src" / "generated" / "public_text.ts"


def generated() -> dict[Path, str]:
    """Each generated file and the text it must have."""
    spec = build()
    return {SPEC_FILE: dumps(spec), SPEC_TS: typescript.render(spec),
            ZIGGURAT_TS: ziggurat.generate(),
            PUBLIC_TEXT_TS: typescript.render_public_text(
                SAMPLE_FILE.read_text(encoding="ascii"))}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in generated().items():
        old = path.read_text(encoding="utf-8") if path.is_file() else None
        if old == text:
            continue
        stale.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        what = "stale" if check else "written"
        print(f"{path.relative_to(REPO)}: {what}", file=sys.stderr if check else sys.stdout)
    if check and stale:
        print("run `python -m shared.spec` to regenerate them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
