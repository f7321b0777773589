"""Splices the Config and ConfigPatch schemas generated from the option table
(`streamfeed --help-openapi`) into openapi/streamfeed.yaml, between the
BEGIN/END marker lines. Run by `make docs`; a test checks the spec is current.

    python3 tools/gen_openapi_config.py build/streamfeed [openapi/streamfeed.yaml] [--check]
"""
import subprocess
import sys

BEGIN = "    # BEGIN generated config schemas\n"
END = "    # END generated config schemas\n"


def generated(binary):
    return subprocess.run([binary, "--help-openapi"], check=True, capture_output=True, text=True).stdout


def splice(spec, block):
    i, j = spec.index(BEGIN), spec.index(END)
    return spec[: i + len(BEGIN)] + block + spec[j:]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    binary = args[0]
    path = args[1] if len(args) > 1 else "openapi/streamfeed.yaml"
    spec = open(path).read()
    new = splice(spec, generated(binary))
    if "--check" in sys.argv:
        if new != spec:
            sys.exit(f"{path}: the config schemas are not current: run `make docs`")
        return
    with open(path, "w") as f:
        f.write(new)


if __name__ == "__main__":
    main()
