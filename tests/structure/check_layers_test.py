#!/usr/bin/env python3
"""Known cases for tools/check_layers.py: which includes break the layers, and the allow-list."""

import os
import subprocess
import sys
import tempfile
import unittest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools')
sys.path.insert(0, TOOLS)
import check_layers as checker  # noqa: E402


def make_tree(root, files):
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)


def violations(files):
    """{(path, target): why} of the tree made of files."""
    with tempfile.TemporaryDirectory() as root:
        make_tree(root, files)
        return {(p, t): why for p, _, t, why in checker.check(root)}


class LayerTest(unittest.TestCase):
    def test_every_file_has_a_layer(self):
        self.assertEqual(checker.layer_of('base/clock.h'), 'base')
        self.assertEqual(checker.layer_of('daemon/server/server.cc'), 'server')
        self.assertEqual(checker.layer_of('daemon/main/engramd_main.cc'), 'daemon-main')
        self.assertEqual(checker.layer_of('daemon/server/engramd_main.cc'), 'server')
        self.assertEqual(checker.layer_of('include/engram/engram.h'), 'public')
        with self.assertRaises(checker.LayerError):
            checker.layer_of('elsewhere/x.h')

    def test_down_the_chain_passes_and_up_fails(self):
        found = violations({
            'base/clock.h': '',
            'tables/table.h': '#include "base/clock.h"\n#include "engram/row.h"\n',
            'include/engram/row.h': '',
            'store/cache.h': '#include "tables/table.h"\n',
            'gather/engine.h': '#include "store/cache.h"\n',
        })
        self.assertEqual(found, {('gather/engine.h', 'store/cache.h'):
                                 'layer gather includes layer store, above it'})

    def test_server_may_not_include_ops_but_ops_may_include_server(self):
        found = violations({
            'daemon/server/server.h': '#include "daemon/ops/log.h"\n',
            'daemon/ops/log.h': '#include "daemon/server/server_config.h"\n',
            'daemon/server/server_config.h': '',
        })
        self.assertEqual(list(found), [('daemon/server/server.h', 'daemon/ops/log.h')])

    def test_main_sits_above_ops_and_nothing_below_includes_it(self):
        found = violations({
            'daemon/main/engramd_main.cc': '#include "daemon/ops/control.h"\n'
                                           '#include "daemon/server/server.h"\n'
                                           '#include "cli/command_line.h"\n',
            'daemon/ops/control.h': '#include "daemon/main/compose.h"\n',
            'daemon/ops/config_resolve.cc': '#include "cli/command_line.h"\n',
            'daemon/server/server.h': '#include "cli/command_line.h"\n',
            'daemon/main/compose.h': '',
            'cli/command_line.h': '',
        })
        self.assertEqual(found, {
            ('daemon/ops/control.h', 'daemon/main/compose.h'):
                'layer ops includes layer daemon-main, above it',
            ('daemon/server/server.h', 'cli/command_line.h'):
                'layer server includes layer cli, beside it',
        })

    def test_siblings_do_not_include_each_other(self):
        found = violations({
            'client/client.h': '#include "gather/engine.h"\n',
            'gather/engine.h': '',
            'kernels/k.cu': '#include "client/client.h"\n',
            'bench/b.cc': '#include "tests/common/util.h"\n',
            'tests/common/util.h': '',
        })
        self.assertEqual(set(found), {('client/client.h', 'gather/engine.h'),
                                      ('kernels/k.cu', 'client/client.h'),
                                      ('bench/b.cc', 'tests/common/util.h')})
        self.assertIn('beside it', found[('bench/b.cc', 'tests/common/util.h')])

    def test_private_headers_stay_in_their_module(self):
        found = violations({
            'tables/table_internal.h': '',
            'tables/table.cc': '#include "tables/table_internal.h"\n',
            'tools/tables/pack.cc': '#include "tables/table_internal.h"\n',
            'client/hash/hasher.h': '',
            'client/client.cc': '#include "client/hash/hasher.h"\n',
            'tests/hash/hasher_test.cc': '#include "client/hash/hasher.h"\n',
            'daemon/ops/metrics.h': '',
            'daemon/tests/metrics_test.cc': '#include "daemon/ops/metrics.h"\n',
            'tests/ops/metrics_test.cc': '#include "daemon/ops/metrics.h"\n',
        })
        self.assertEqual(set(found), {('tools/tables/pack.cc', 'tables/table_internal.h'),
                                      ('tests/hash/hasher_test.cc', 'client/hash/hasher.h'),
                                      ('tests/ops/metrics_test.cc', 'daemon/ops/metrics.h')})
        self.assertIn('private to tables', found[('tools/tables/pack.cc',
                                                  'tables/table_internal.h')])

    def test_includes_resolve_like_the_compiler(self):
        found = violations({
            # Beside the file first, then the root, then include/; outside the tree is skipped.
            'store/a.h': '#include "b.h"\n#include <vector>\n#include "absl/status/status.h"\n',
            'store/b.h': '',
            'tables/t.h': '#include <engram/x.h>\n// #include "store/a.h" is a comment\n',
            'include/engram/x.h': '#include "store/a.h"\n',
        })
        self.assertEqual(list(found), [('include/engram/x.h', 'store/a.h')])


class AllowListTest(unittest.TestCase):
    def run_checker(self, files, allow):
        with tempfile.TemporaryDirectory() as root:
            make_tree(root, files)
            with open(os.path.join(root, 'allow.txt'), 'w') as f:
                f.write(allow)
            result = subprocess.run(
                [sys.executable, os.path.join(TOOLS, 'check_layers.py'), '--root', root,
                 '--allow', os.path.join(root, 'allow.txt')],
                capture_output=True, text=True)
            return result.returncode, result.stderr

    TREE = {'gather/engine.h': '#include "store/cache.h"\n', 'store/cache.h': ''}

    def test_violation_fails_naming_file_and_include(self):
        rc, err = self.run_checker(self.TREE, '')
        self.assertEqual(rc, 1)
        self.assertIn('gather/engine.h:1: #include "store/cache.h": layer gather includes '
                      'layer store, above it', err)

    def test_allow_listed_violation_passes(self):
        rc, err = self.run_checker(self.TREE, '# comment\ngather/engine.h  store/cache.h  to move\n')
        self.assertEqual((rc, err), (0, ''))

    def test_allow_listed_include_that_is_fine_fails(self):
        rc, err = self.run_checker(self.TREE, 'gather/engine.h  store/cache.h  to move\n'
                                              'store/cache.h  gather/engine.h  to move\n')
        self.assertEqual(rc, 1)
        self.assertIn('store/cache.h no longer includes gather/engine.h', err)

    def test_include_of_a_file_in_no_layer_fails(self):
        rc, err = self.run_checker({'tools/x.cc': '#include "y/z.h"\n', 'y/z.h': ''}, '')
        self.assertEqual(rc, 1)
        self.assertIn('y/z.h: in no layer', err)

    def test_allow_list_line_without_reason_fails(self):
        rc, err = self.run_checker(self.TREE, 'gather/engine.h  store/cache.h\n')
        self.assertNotEqual(rc, 0)
        self.assertIn('expected "path  included-path  reason"', err)


if __name__ == '__main__':
    unittest.main()
