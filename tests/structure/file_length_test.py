#!/usr/bin/env python3
"""Known cases for tools/check_file_length.py: which files it counts, their limits, its report."""

import os
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools')
sys.path.insert(0, TOOLS)
import check_file_length as checker  # noqa: E402


def lines(n, first='x = 1'):
    return first + '\n' + ''.join(f'x = {k}\n' for k in range(n - 1))


class CheckerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)

    def run_checker(self, *extra):
        result = subprocess.run(
            [sys.executable, os.path.join(TOOLS, 'check_file_length.py'), '--root', self.root,
             *extra], capture_output=True, text=True)
        return result.returncode, result.stderr

    def test_production_file_over_800_lines_fails_with_path_count_limit_and_reason(self):
        self.write('daemon/big.cc', lines(801))
        self.write('daemon/fits.cc', lines(800))
        rc, err = self.run_checker()
        self.assertEqual(rc, 1)
        self.assertIn('error: daemon/big.cc: 801 lines, over the limit of 800 for a production '
                      'source file: a file holds one concern', err)
        self.assertNotIn('fits.cc', err)

    def test_bench_files_have_a_limit_of_1000(self):
        self.write('bench/x/big_bench.cc', lines(1001))
        self.write('bench/x/fits_bench.cc', lines(1000))
        rc, err = self.run_checker()
        self.assertEqual(rc, 1)
        self.assertIn('bench/x/big_bench.cc: 1001 lines, over the limit of 1000 for a benchmark '
                      'file: a benchmark is its cases plus a shared driver', err)
        self.assertNotIn('fits_bench.cc', err)

    def test_limits_are_options(self):
        self.write('client/a.h', lines(11))
        self.write('bench/b.cc', lines(21))
        rc, err = self.run_checker('--limit', '10', '--bench-limit', '20')
        self.assertEqual(rc, 1)
        self.assertIn('client/a.h: 11 lines, over the limit of 10', err)
        self.assertIn('bench/b.cc: 21 lines, over the limit of 20', err)

    def test_tests_docs_and_build_output_are_left_out(self):
        self.write('tests/daemon/long_test.cc', lines(5000))
        self.write('docs/example.py', lines(5000))
        self.write('build/meson-private/coredata.dat', '')
        self.write('build/gen/generated.cc', lines(5000))
        self.write('out-of-tree/build.ninja', '')
        self.write('out-of-tree/gen.h', lines(5000))
        self.write('python/venv/pyvenv.cfg', '')
        self.write('python/venv/lib/site.py', lines(5000))
        self.write('python/engram/__pycache__/x.py', lines(5000))
        self.write('subprojects/dep/dep.cc', lines(5000))
        self.write('daemon/ok.cc', lines(10))
        rc, err = self.run_checker()
        self.assertEqual((rc, err), (0, ''))

    def test_which_files_count(self):
        counted = {
            'a/x.c': '', 'a/x.cc': '', 'a/x.cpp': '', 'a/x.h': '', 'a/x.hpp': '',
            'a/x.cu': '', 'a/x.cuh': '', 'a/x.hip': '', 'a/x.py': '', 'a/x.sh': '',
            '.ci/run': '#!/usr/bin/env bash\n', 'a/engramd.postinst': '#!/bin/sh\n',
            'a/tool': '#!/usr/bin/python3\n',
        }
        not_counted = {
            'a/dash.json': '', 'a/README.md': '', 'a/meson.build': '',
            'a/rules': '#!/usr/bin/make -f\n', 'a/trace.mjs': '', 'a/data': 'no shebang\n',
            'a/unit.service': '',
        }
        for rel, first in {**counted, **not_counted}.items():
            self.write(rel, first + lines(900))
        rc, err = self.run_checker()
        self.assertEqual(rc, 1)
        for rel in counted:
            self.assertIn(f'error: {rel}: ', err)
        for rel in not_counted:
            self.assertNotIn(f'{rel}:', err)

    def test_last_line_without_newline_counts(self):
        self.write('a/x.cc', lines(800) + 'tail')
        rc, err = self.run_checker()
        self.assertEqual(rc, 1)
        self.assertIn('a/x.cc: 801 lines', err)

    def test_paths_narrow_the_check(self):
        self.write('client/big.cc', lines(900))
        self.write('store/ok.cc', lines(10))
        self.assertEqual(self.run_checker('store'), (0, ''))
        self.assertEqual(self.run_checker('client')[0], 1)
        self.assertEqual(self.run_checker('store/ok.cc'), (0, ''))

    def test_area_of_a_path(self):
        self.assertEqual(checker.area('bench/daemon/x.cc'), 'bench')
        self.assertEqual(checker.area('meson.build'), '')
        self.assertEqual(checker.limit_for('bench/x.cc', 800, 1000)[0], 1000)
        self.assertEqual(checker.limit_for('benchmarks/x.cc', 800, 1000)[0], 800)


if __name__ == '__main__':
    unittest.main()
