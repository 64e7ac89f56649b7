#!/usr/bin/env python3
"""Lists C/C++ functions longer than a limit, and checks them against an allow-list.

A function's length is counted from the line of its body's opening brace to the line of its
closing brace, both included. The scan is lexical, not a compiler: it blanks comments, string,
character and raw-string literals and preprocessor lines, then matches braces. A `{` at
namespace or class scope opens a function body when the text before it ends in a parameter list,
optionally followed by const/noexcept/override/final/mutable/&/&&, a trailing `-> type`, a
`requires` clause or a constructor's member-initialiser list; lambdas at namespace scope (in a
table or bound to a variable) count as functions of their own, lambdas inside a function count
toward that function.

CUDA/HIP device code (`__global__` or `__device__` functions) is left out: its shape follows
register pressure and unrolling, and splitting it can cost a kernel's speed; host code in a .cu
file is checked like any other.

Usage:
  check_function_length.py [--limit 80] [--root DIR] [--allow FILE] PATH...
Without --allow it lists every function over the limit and exits 1 if there is one. With
--allow it exits 1 when a function over the limit is not in the list, or when a listed function
is no longer over the limit (the list only shrinks). The allow-list has one function a line:
`path  name  reason`, path relative to --root, name as this script prints it, and a reason
(or "to split"); `#` starts a comment.
"""

import argparse
import dataclasses
import os
import re
import sys

SOURCE_SUFFIXES = ('.c', '.cc', '.cpp', '.cxx', '.h', '.hh', '.hpp', '.cu', '.cuh')


class ScanError(Exception):
    """The file's braces do not balance, so no length in it can be trusted."""


@dataclasses.dataclass
class Function:
    path: str
    name: str
    first_line: int
    last_line: int

    @property
    def lines(self):
        return self.last_line - self.first_line + 1


# ---- Blanking: comments, literals and preprocessor lines become spaces (newlines are kept). ----

_RAW_STRING = re.compile(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(')


def _blank(text):
    return re.sub(r'[^\n]', ' ', text)


def blank_source(src):
    """Returns src with comments, literals and directives blanked; string quotes are kept."""
    out = []
    i, n = 0, len(src)
    line_start = True
    while i < n:
        c = src[i]
        if line_start and c == '#':
            j = i
            while j < n and src[j] != '\n':
                j = j + 2 if src[j] == '\\' and j + 1 < n else j + 1
            out.append(_blank(src[i:j]))
            i = j
            continue
        if c == '\n':
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            out.append(_blank(src[i:j]))
            i = j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2)
            if j < 0:
                raise ScanError(f'unterminated comment at offset {i}')
            out.append(_blank(src[i:j + 2]))
            i = j + 2
        elif c == '"' or c in 'RuUL' and _RAW_STRING.match(src, i):
            m = _RAW_STRING.match(src, i) if c != '"' else None
            if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == '_')):
                end = src.find(')' + m.group(1) + '"', m.end())
                if end < 0:
                    raise ScanError(f'unterminated raw string at offset {i}')
                end += len(m.group(1)) + 2
                out.append('"' + _blank(src[i + 1:end - 1]) + '"')
                i = end
            elif c == '"':
                j = _skip_quoted(src, i, '"')
                out.append('"' + _blank(src[i + 1:j - 1]) + '"')
                i = j
            else:
                out.append(c)
                i += 1
        elif c == "'" and not _is_digit_separator(src, i):
            j = _skip_quoted(src, i, "'")
            out.append("'" + _blank(src[i + 1:j - 1]) + "'")
            i = j
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def _skip_quoted(src, i, quote):
    j = i + 1
    while j < len(src):
        if src[j] == '\\':
            j += 2
        elif src[j] == quote:
            return j + 1
        elif src[j] == '\n':
            break
        else:
            j += 1
    raise ScanError(f'unterminated {quote} literal at line {src.count(chr(10), 0, i) + 1}')


def _is_digit_separator(src, i):
    """True for the ' in 1'000'000 or 0xFF'FF: the token it sits in starts with a digit."""
    j = i
    while j > 0 and (src[j - 1].isalnum() or src[j - 1] in "_.'"):
        j -= 1
    return j < i and src[j].isdigit()


# ---- Classifying the text before a `{` at namespace, class or table scope. ----

_QUALIFIER_TAIL = re.compile(
    r'(?:\s+|\b(?:const|volatile|noexcept|override|final|mutable|constexpr|consteval|try)\b|&&?)$')
_ACCESS = re.compile(r'^\s*(?:public|private|protected)\s*:(?!:)')
_NAME_BEFORE_PARAMS = re.compile(
    r'(?<![\w~])((?:[A-Za-z_]\w*\s*(?:<[^()]*?>)?\s*::\s*)*~?'
    r'(?:operator\s*(?:\(\s*\)|\[\s*\]|[^\s\w(]+|\s+[A-Za-z_][\w\s:*&<>]*?)|[A-Za-z_]\w*))'
    r'\s*(?:<[^()]*>)?\s*\(')
_CLASS_KEY = re.compile(r'\b(class|struct|union|enum)\b')
_DEVICE = re.compile(r'\b(__global__|__device__)\b')


def _top_level(header):
    """header with the insides of () and [] dropped: `f(int a) const` becomes `f() const`."""
    out, depth = [], 0
    for ch in header:
        if ch in ')]':
            depth = max(depth - 1, 0)
        if depth == 0:
            out.append(ch)
        if ch in '([':
            depth += 1
    return ''.join(out)


def _rfind_top(header, marker):
    """Offset of the last marker in header outside (), [] and {}, or -1."""
    depth = 0
    found = -1
    for k, ch in enumerate(header):
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
        elif depth == 0 and header.startswith(marker, k):
            found = k
    return found


def _strip_tail(header):
    """Drops trailing qualifiers, a trailing return type and a requires clause."""
    for marker in (' requires ', '->'):
        k = _rfind_top(header, marker)
        if k >= 0 and _strip_qualifiers(header[:k]).endswith(')'):
            header = header[:k]
    return _strip_qualifiers(header)


def _strip_qualifiers(header):
    prev = None
    while prev != header:
        prev = header
        header = _QUALIFIER_TAIL.sub('', header)
    return header


def _ctor_init_start(header):
    """Offset of a constructor's member-initialiser colon in header, or -1."""
    depth = 0
    seen_params = False
    for k, ch in enumerate(header):
        if ch in '([':
            depth += 1
        elif ch in ')]':
            depth -= 1
            if depth == 0 and ch == ')':
                seen_params = True
        elif ch == ':' and depth == 0 and seen_params:
            if header[k + 1:k + 2] == ':' or header[k - 1:k] == ':':
                continue
            between = header[header.rfind(')', 0, k) + 1:k]
            if re.fullmatch(r'\s*(?:noexcept\s*)?', between):
                return k
    return -1


def _lambda_introducer_at_end(header):
    """True when header ends with `[...]` that opens a lambda, not an array declarator."""
    if not header.endswith(']'):
        return False
    depth = 0
    for k in range(len(header) - 1, -1, -1):
        if header[k] == ']':
            depth += 1
        elif header[k] == '[':
            depth -= 1
            if depth == 0:
                before = header[:k].rstrip()
                return not before or not (before[-1].isalnum() or before[-1] in '_]')
    return False


def classify(header, in_table):
    """What a `{` opens given the text before it: function, init, class, open or table.

    init: a brace inside a signature (a default argument, a member initialiser), skipped as
    part of it; open: a namespace or extern "C" block; table: a brace initialiser, whose nested
    braces may hold lambdas.
    """
    text = header.strip()
    while _ACCESS.match(text):
        text = _ACCESS.sub('', text, count=1).strip()
    if re.match(r'^(?:inline\s+)?namespace\b', text) or re.fullmatch(r'extern\s*""', text):
        return 'open'
    open_paren = _innermost_open_paren(text)
    if open_paren >= 0:
        # Inside an argument list: a lambda passed to a call, or a default argument's braces.
        argument = text[open_paren + 1:]
        comma = _rfind_top(argument, ',')
        argument = argument[comma + 1:]
        return 'function' if classify(argument, True) == 'function' else 'init'
    if not in_table and _ctor_init_start(text) >= 0:
        return 'function' if text.endswith((')', '}')) else 'init'
    stripped = _strip_tail(text).rstrip()
    if stripped.endswith(')') or _lambda_introducer_at_end(stripped):
        return 'function'
    if not in_table and _CLASS_KEY.search(_top_level(re.sub(r'^template\s*<.*?>', '', text))):
        return 'class'
    return 'table'


def _innermost_open_paren(text):
    """Offset of the last ( or [ in text that is not closed, or -1."""
    opened = []
    for k, ch in enumerate(text):
        if ch in '([':
            opened.append(k)
        elif ch in ')]' and opened:
            opened.pop()
    return opened[-1] if opened else -1


def function_name(header, class_names):
    text = re.sub(r'\s+', ' ', header.strip())
    while _ACCESS.match(text):
        text = _ACCESS.sub('', text, count=1).strip()
    text = re.sub(r'\[\[.*?\]\]', '', text)
    text = re.sub(r'^template\s*<(?:[^<>]|<[^<>]*>)*>\s*', '', text)
    init = _ctor_init_start(text)
    if init >= 0:
        text = text[:init]
    m = _NAME_BEFORE_PARAMS.search(text)
    if m and not text[:m.start()].rstrip().endswith(('[', '=')):
        name = re.sub(r'\s+', '', m.group(1))
    else:
        var = re.search(r'([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*=[^=]*$', text)
        name = (var.group(1) if var else '') + '[lambda]'
    scope = '::'.join(class_names)
    return f'{scope}::{name}' if scope else name


# ---- The brace scan. ----

@dataclasses.dataclass
class _Scope:
    kind: str            # 'open', 'class', 'table', 'function' or 'block'
    name: str = ''
    first_line: int = 0
    header: str = ''
    skip: bool = False   # device code: its length is not checked


def scan(path, src):
    """Returns the functions defined in src, outermost ones only (lambdas count to them)."""
    text = blank_source(src)
    functions = []
    stack = []
    in_function = 0      # how many function scopes are open (more than one: a nested class)
    header_start = 0
    line = 1
    paren = 0
    i = 0
    while i < len(text):
        c = text[i]
        if c == '\n':
            line += 1
        elif in_function and c not in '{}':
            pass
        elif c in '([':
            paren += 1
        elif c in ')]':
            paren = max(paren - 1, 0)
        elif c == ';':
            header_start = i + 1
            paren = 0
        elif c == ',' and paren == 0 and stack and stack[-1].kind == 'table':
            header_start = i + 1
        elif c == '{':
            if in_function:
                stack.append(_Scope('block'))
            else:
                header = text[header_start:i]
                in_table = bool(stack) and stack[-1].kind == 'table'
                kind = classify(header, in_table)
                if kind == 'init':
                    i, line = _skip_braces(text, i, line)
                    continue
                if kind == 'function':
                    classes = [s.name for s in stack if s.kind == 'class']
                    stack.append(_Scope('function', function_name(header, classes), line,
                                        skip=bool(_DEVICE.search(header))))
                    in_function += 1
                elif kind == 'class':
                    stack.append(_Scope('class', _class_name(header)))
                else:
                    stack.append(_Scope(kind))
                header_start = i + 1
                paren = 0
        elif c == '}':
            if not stack:
                raise ScanError(f'unmatched }} at line {line}')
            scope = stack.pop()
            if scope.kind == 'function':
                in_function -= 1
                if not scope.skip:
                    functions.append(Function(path, scope.name, scope.first_line, line))
            if not in_function:
                header_start = i + 1
                paren = 0
        i += 1
    if stack:
        raise ScanError(f'{len(stack)} unclosed {{ at end of file')
    return functions


def _class_name(header):
    top = _top_level(re.sub(r'^\s*template\s*<.*?>', '', header.strip())) + ' '
    m = re.search(r'\b(?:class|struct|union|enum)\s+(?:[\w()]+\s+)*?([A-Za-z_]\w*)\s*'
                  r'(?:final\s*)?(?::[^:]|$)', top)
    return m.group(1) if m else ''


def _skip_braces(text, i, line):
    """Skips the balanced {...} starting at text[i]; returns the offset after it and the line."""
    depth = 0
    while i < len(text):
        if text[i] == '\n':
            line += 1
        elif text[i] == '{':
            depth += 1
        elif text[i] == '}':
            depth -= 1
            if depth == 0:
                return i + 1, line
        i += 1
    raise ScanError('unclosed { in an initialiser at end of file')


# ---- Files, the allow-list and the report. ----

def source_files(root, paths):
    for p in paths:
        full = os.path.join(root, p)
        if os.path.isfile(full):
            yield os.path.relpath(full, root)
            continue
        if not os.path.isdir(full):
            raise FileNotFoundError(f'{p}: no such file or folder under {root}')
        for dirpath, dirnames, filenames in os.walk(full):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def read_allow_list(path):
    """{(path, name): reason}; a malformed line is an error naming it."""
    allowed = {}
    with open(path, encoding='utf-8') as f:
        for number, raw in enumerate(f, 1):
            entry = raw.split('#', 1)[0].strip()
            if not entry:
                continue
            parts = entry.split(None, 2)
            if len(parts) < 3:
                raise ValueError(f'{path}:{number}: expected "path  name  reason", got {raw!r}')
            key = (parts[0], parts[1])
            if key in allowed:
                raise ValueError(f'{path}:{number}: {parts[0]} {parts[1]} is listed twice')
            allowed[key] = parts[2]
    return allowed


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--limit', type=int, default=80, help='most lines a function may have')
    parser.add_argument('--root', default='.', help='folder the paths are relative to')
    parser.add_argument('--allow', help='allow-list of functions still over the limit')
    parser.add_argument('paths', nargs='+', help='files or folders to check')
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error(f'--limit must be at least 1, got {args.limit}')

    long_functions = []
    errors = []
    for rel in source_files(args.root, args.paths):
        with open(os.path.join(args.root, rel), encoding='utf-8', errors='replace') as f:
            src = f.read()
        try:
            long_functions += [fn for fn in scan(rel, src) if fn.lines > args.limit]
        except ScanError as e:
            errors.append(f'{rel}: cannot scan: {e}')

    allowed = read_allow_list(args.allow) if args.allow else {}
    over = {(fn.path, fn.name) for fn in long_functions}
    for fn in long_functions:
        listed = (fn.path, fn.name) in allowed
        mark = 'allowed' if listed else 'OVER'
        print(f'{fn.path}:{fn.first_line}: {fn.name}: {fn.lines} lines ({mark})')
        if not listed:
            errors.append(f'{fn.path}:{fn.first_line}: {fn.name} has {fn.lines} lines, over the '
                          f'limit of {args.limit}: split it (or list it in the allow-list)')
    checked = set(source_files(args.root, args.paths))
    for (path, name), reason in sorted(allowed.items()):
        if (path, name) not in over:
            where = 'is no longer over the limit' if path in checked else 'is not in a checked path'
            errors.append(f'{args.allow}: {path} {name} {where}: remove it from the allow-list')
    for e in errors:
        print(f'error: {e}', file=sys.stderr)
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
