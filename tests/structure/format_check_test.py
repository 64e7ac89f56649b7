#!/usr/bin/env python3
"""Known cases for tools/check_format.py: which files it walks, what it reports, what --fix does."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
CHECKER = os.path.join(ROOT, 'tools', 'check_format.py')
FORMATTED = 'int F(int x) { return x + 1; }\n'
UNFORMATTED = 'int   F( int x ){return x+1;}\n'


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, 'w') as f:
        f.write(text)


def check(root, *args):
    return subprocess.run([sys.executable, CHECKER, '--root', root, *args],
                          capture_output=True, text=True)


@unittest.skipIf(shutil.which('clang-format') is None, 'clang-format is not installed')
class FormatCheckTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.root)
        shutil.copy(os.path.join(ROOT, '.clang-format'), self.root)

    def test_reports_only_the_unformatted_file(self):
        write(self.root, 'lib/good.cc', FORMATTED)
        write(self.root, 'lib/bad.cc', UNFORMATTED)
        write(self.root, 'lib/notes.txt', UNFORMATTED)
        run = check(self.root, 'lib')
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertIn('lib/bad.cc', run.stdout)
        self.assertNotIn('lib/good.cc', run.stdout)
        self.assertNotIn('notes.txt', run.stdout)

    def test_daemon_tests_are_not_production(self):
        write(self.root, 'daemon/server.cc', FORMATTED)
        write(self.root, 'daemon/tests/x_test.cc', UNFORMATTED)
        run = check(self.root, 'daemon')
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn('1 files checked', run.stdout)

    def test_fix_rewrites_and_then_the_check_passes(self):
        write(self.root, 'lib/bad.cu', UNFORMATTED)
        self.assertEqual(check(self.root, '--fix', 'lib').returncode, 0)
        with open(os.path.join(self.root, 'lib/bad.cu')) as f:
            self.assertEqual(f.read(), FORMATTED)
        self.assertEqual(check(self.root, 'lib').returncode, 0)

    def test_a_clang_format_off_region_is_kept(self):
        write(self.root, 'lib/table.h',
              '// clang-format off\nint  kTable[] = { 1,  2,\n                3 };\n'
              '// clang-format on\n')
        run = check(self.root, 'lib')
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)


if __name__ == '__main__':
    unittest.main()
