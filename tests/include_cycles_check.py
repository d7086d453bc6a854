#!/usr/bin/python3
"""No include cycles among the modules of the given folders: dependencies point one way.

    include_cycles_check.py ROOT FOLDER...

A module is a header and its sources (`server/core/call.h`, `server/core/call.cc`: module `server/call`;
a header `x_internal.h`, the private part of module x shared by its files, belongs to x);
module A depends on module B when any file of A includes B's header by its repository path
(`#include "server/core/dispatcher.h"`). A cycle (A needs B, B needs A, through any chain) means
neither can be read, tested or changed alone: this fails naming each cycle's modules, and for
each one the includes that close it. Exit 0 when there is none.

Run with --self-test first (ctest does): a small tree with a cycle must be reported and one
without must pass, so the check cannot pass by failing to read anything.
"""
import collections
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SUFFIXES = (".h", ".cc", ".cu")


def modules(root, folders):
    """{repository path of each file: its module}, for the files under `folders`."""
    files = {}
    for folder in folders:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in names:
                if name.endswith(SUFFIXES):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    module = os.path.splitext(rel)[0]
                    files[rel] = module[:-len("_internal")] if module.endswith("_internal") else module
    return files


def dependencies(root, files):
    """{module: {module it includes: the first 'file: #include' line that does}}."""
    deps = collections.defaultdict(dict)
    for rel, module in sorted(files.items()):
        with open(os.path.join(root, rel), errors="replace") as f:
            for line in f:
                m = INCLUDE.match(line)
                if m and m.group(1) in files:
                    target = files[m.group(1)]
                    if target != module:
                        deps[module].setdefault(target, f"{rel}: {line.strip()}")
    return deps


def cycles(nodes, deps):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(deps.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(deps.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def check(root, folders, out=sys.stdout):
    files = modules(root, folders)
    deps = dependencies(root, files)
    found = cycles(set(files.values()), deps)
    for component in found:
        members = set(component)
        print("include cycle: " + " <-> ".join(component), file=out)
        for module in component:
            for target, where in sorted(deps[module].items()):
                if target in members:
                    print(f"    {where}", file=out)
    if not found:
        print(f"no include cycles among {len(set(files.values()))} modules of "
              f"{', '.join(folders)}", file=out)
    return not found, len(files)


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(path, *includes):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.writelines(f'#include "{i}"\n' for i in includes)
        write("a/x.h")
        write("a/x.cc", "a/x.h", "a/y.h")
        write("a/y.h", "a/z.h")
        write("a/z.cc", "a/z.h", "a/x.h")  # x -> y -> z -> x, through a source file
        write("a/z.h")
        with open(os.devnull, "w") as null:
            ok, n = check(root, ["a"], null)
            assert not ok and n == 5, "a cycle through a .cc file was not reported"
            write("a/z.cc", "a/z.h")
            ok, _ = check(root, ["a"], null)
            assert ok, "a tree without a cycle was reported"


def main():
    if sys.argv[1:2] == ["--self-test"]:
        self_test()
        del sys.argv[1]
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ok, n = check(sys.argv[1], sys.argv[2:])
    if n == 0:
        sys.exit("no source files found: wrong ROOT or FOLDER")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
