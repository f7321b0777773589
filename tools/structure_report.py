"""Lists what the layout rules of docs/DESIGN.md §2 bound: every function of
the service longer than 150 lines and every service file longer than 1 500
lines, measured with lizard (C, CUDA, Python) over gpu/, server/, handlers/,
client/ and collective/. Exits 1 when anything is over, so a change can be
checked before it is committed:

    python3 tools/structure_report.py [--top N]

--top N also prints the N longest functions and files. lizard reads CUDA as
C++: it has no language of its own for .cu and .cuh, so they are added to
its C/C++ reader here. Needs lizard (tests/requirements.txt: the test virtualenv
has it).
"""
import argparse
import sys
from pathlib import Path

import lizard
from lizard_languages.clike import CLikeReader

REPO = Path(__file__).resolve().parents[1]
SERVICE = ("gpu", "server", "handlers", "client", "collective")
SOURCE = {".c", ".h", ".cc", ".cu", ".cuh", ".py"}
MAX_FUNCTION_LINES = 150
MAX_FILE_LINES = 1500


def service_files():
    for top in SERVICE:
        for p in sorted((REPO / top).rglob("*")):
            if p.is_file() and p.suffix in SOURCE:
                yield p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=0, help="also print the N longest functions and files")
    args = ap.parse_args()
    CLikeReader.ext = list(CLikeReader.ext) + ["cu", "cuh"]
    functions, files = [], []
    for p in service_files():
        rel = p.relative_to(REPO)
        files.append((len(p.read_text(errors="replace").splitlines()), str(rel)))
        for fn in lizard.analyze_file(str(p)).function_list:
            functions.append((fn.length, f"{rel}:{fn.start_line}", fn.name))
    functions.sort(reverse=True)
    files.sort(reverse=True)
    long_functions = [f for f in functions if f[0] > MAX_FUNCTION_LINES]
    long_files = [f for f in files if f[0] > MAX_FILE_LINES]
    for n, where, name in long_functions:
        print(f"function over {MAX_FUNCTION_LINES} lines: {where} {name} ({n})")
    for n, where in long_files:
        print(f"file over {MAX_FILE_LINES} lines: {where} ({n})")
    if args.top:
        print(f"longest functions ({len(functions)} read):")
        for n, where, name in functions[:args.top]:
            print(f"  {n:5d} {where} {name}")
        print(f"longest files ({len(files)} read):")
        for n, where in files[:args.top]:
            print(f"  {n:5d} {where}")
    return 1 if long_functions or long_files else 0


if __name__ == "__main__":
    sys.exit(main())
