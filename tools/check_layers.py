#!/usr/bin/env python3
"""Checks that every #include points down the layers and stays out of other modules' private headers.

Usage:
  check_layers.py [--root DIR] [--allow FILE]

Every C/C++/CUDA file under the root's source folders is given a layer by its path (LAYERS below,
the longest prefix wins; a file in no layer is an error, so a new folder must be placed). Each
quoted include (and each <engram/...> include) is resolved the way the compiler does: beside the
including file first, then from the root (inc_root), then from include/ (inc_public); an include
that resolves to no file in the tree is outside the project and not checked. An include is a
violation when
  - the included file's layer is not one the including layer may use (MAY_USE), or
  - the included file is private to a module (PRIVATE) and the including file is outside it.
With --allow, a violation listed in the allow-list passes, and a listed line that is no longer a
violation fails, so the list only shrinks. The allow-list has one include a line:
  path  included-path  reason
The order of the layers is drawn in docs/architecture.md.
"""

import argparse
import os
import re
import sys

SOURCE_FOLDERS = ['abi', 'base', 'bench', 'cli', 'client', 'daemon', 'gather', 'hash', 'include',
                  'kernels', 'protocol', 'store', 'tables', 'testkit', 'tests', 'tools']
SOURCE_SUFFIXES = ('.h', '.hpp', '.cc', '.cpp', '.c', '.cu', '.cuh')

# Path prefix -> layer. The longest matching prefix names a file's layer.
LAYERS = {
    'include/engram/': 'public',
    'abi/': 'public',
    'base/': 'base',
    'tables/': 'tables',
    'protocol/': 'protocol',
    'gather/': 'gather',
    'store/': 'store',
    'daemon/server/': 'server',
    'daemon/ops/': 'ops',
    'daemon/main/': 'daemon-main',
    'daemon/tests/': 'daemon-tests',
    'cli/': 'cli',
    'hash/': 'hash',
    'client/': 'client',
    'kernels/': 'kernels',
    'testkit/': 'testkit',
    'tools/': 'tools',
    'bench/': 'bench',
    'tests/': 'tests',
}

# The daemon's chain: each layer may use every layer before it.
CHAIN = ['public', 'base', 'tables', 'protocol', 'gather', 'store', 'server', 'ops', 'daemon-main']
LIBRARIES = CHAIN[:6] + ['hash', 'client', 'kernels']
MAY_USE = {layer: set(CHAIN[:i + 1]) for i, layer in enumerate(CHAIN)}
# engramd's flags come from operations' settings table (daemon/ops/config_resolve.h) and are
# parsed as every tool parses its command line.
MAY_USE['ops'].add('cli')
MAY_USE['daemon-main'].add('cli')
MAY_USE.update({
    # The n-gram hasher: the public ABI and the utilities under it.
    'hash': {'public', 'base', 'hash'},
    # libengram_client.so: the public ABI, the wire protocol, the hasher and the utilities under
    # them.
    'client': {'public', 'base', 'protocol', 'hash', 'client'},
    # The kernels see the client only through its public ABI; they read the row cache's
    # shared-memory layout, which processes share through protocol/, as the client does.
    'kernels': {'public', 'base', 'protocol', 'kernels'},
    # What tests, benchmarks and tools share: any library, never the daemon's insides.
    'testkit': set(LIBRARIES) | {'testkit'},
    'tools': set(LIBRARIES) | {'testkit', 'tools', 'cli'},
    'bench': set(LIBRARIES) | {'testkit', 'bench', 'cli'},
    'tests': set(LIBRARIES) | {'testkit', 'tests', 'cli'},
    # The command-line conventions every program parses through: CLI11 only.
    'cli': {'cli'},
    # The unit tests of the daemon's private parts.
    'daemon-tests': set(CHAIN) | {'client', 'kernels', 'testkit', 'tests', 'daemon-tests'},
})

# Private headers: path prefix -> the prefixes of the module that may include them.
PRIVATE = {
    'tables/table_internal.h': ('tables/',),
    'client/': ('client/',),
    'daemon/': ('daemon/',),
    'tests/': ('tests/', 'daemon/tests/'),
    'bench/': ('bench/',),
    'tools/tables/': ('tools/tables/',),
    'tools/engramctl/': ('tools/engramctl/',),
}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(engram/[^>]+)>)', re.MULTILINE)


class LayerError(Exception):
    pass


def longest_prefix(path, table):
    best = None
    for prefix in table:
        if path == prefix or (prefix.endswith('/') and path.startswith(prefix)):
            if best is None or len(prefix) > len(best):
                best = prefix
    return best


def layer_of(path):
    prefix = longest_prefix(path, LAYERS)
    if prefix is None:
        raise LayerError(f'{path}: in no layer: add its folder to LAYERS in tools/check_layers.py')
    return LAYERS[prefix]


def includes(src):
    """(line, text) of each include the check follows."""
    for m in INCLUDE_RE.finditer(src):
        yield src.count('\n', 0, m.start()) + 1, m.group(1) or m.group(2)


def resolve(root, path, included, exists):
    """The tree path an include names, or None when it is outside the tree."""
    for candidate in (os.path.join(os.path.dirname(path), included), included,
                      os.path.join('include', included)):
        candidate = os.path.normpath(candidate)
        if exists(candidate):
            return candidate
    return None


def violation(path, target):
    """Why path may not include target, or None."""
    mine, theirs = layer_of(path), layer_of(target)
    if theirs not in MAY_USE[mine]:
        where = 'beside it'
        if mine in CHAIN and theirs in CHAIN and CHAIN.index(theirs) > CHAIN.index(mine):
            where = 'above it'
        return f'layer {mine} includes layer {theirs}, {where}'
    private = longest_prefix(target, PRIVATE)
    if private is not None and not any(path.startswith(p) for p in PRIVATE[private]):
        return f'includes a header private to {PRIVATE[private][0].rstrip("/")}'
    return None


def source_files(root):
    for folder in SOURCE_FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith('.'))
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def check(root, files=None):
    """[(path, line, target, why)] of every violation under root."""
    if files is None:
        files = list(source_files(root))
    known = set(files)

    def exists(p):
        return p in known or os.path.isfile(os.path.join(root, p))

    found = []
    for path in files:
        with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
            src = f.read()
        for line, included in includes(src):
            target = resolve(root, path, included, exists)
            if target is None or target == path:
                continue
            why = violation(path, target)
            if why:
                found.append((path, line, target, why))
    return found


def read_allow_list(path):
    allowed = {}
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith('#'):
                continue
            parts = line.split(None, 2)
            if len(parts) < 3:
                raise SystemExit(f'{path}:{n}: expected "path  included-path  reason", got: {line}')
            key = (parts[0], parts[1])
            if key in allowed:
                raise SystemExit(f'{path}:{n}: {parts[0]} {parts[1]} is listed twice')
            allowed[key] = parts[2]
    return allowed


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default='.', help='the source tree')
    parser.add_argument('--allow', help='allow-list of includes still against the layers')
    args = parser.parse_args(argv)

    errors = []
    try:
        found = check(args.root)
    except LayerError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    allowed = read_allow_list(args.allow) if args.allow else {}
    for path, line, target, why in found:
        listed = (path, target) in allowed
        print(f'{path}:{line}: #include "{target}": {why}' + (' (allowed)' if listed else ''))
        if not listed:
            errors.append(f'{path}:{line}: #include "{target}": {why}: move the code to the '
                          f'layer that both may use (or list it in the allow-list)')
    seen = {(path, target) for path, _, target, _ in found}
    for (path, target) in sorted(allowed):
        if (path, target) not in seen:
            errors.append(f'{args.allow}: {path} no longer includes {target} against the layers: '
                          f'remove it from the allow-list')
    for e in errors:
        print(f'error: {e}', file=sys.stderr)
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
