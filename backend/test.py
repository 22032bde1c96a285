#!/usr/bin/env python3
"""Smoke run in the host's convention: start the server, load the embedded
default model, one Predict and one PredictStream; non-zero exit on failure."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.launcher import Backend, chat  # noqa: E402


class SmokeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.backend = Backend()
        cls.backend.wait_healthy()

    @classmethod
    def tearDownClass(cls):
        cls.backend.stop()

    def test_load_predict_stream(self):
        result = self.backend.load("")
        self.assertTrue(result.success, result.message)
        reply = self.backend.stub.Predict(chat("What is the capital of France?", Tokens=24), timeout=120)
        self.assertIn("Paris", reply.message.decode())
        self.assertGreater(reply.tokens, 0)
        chunks = list(self.backend.stub.PredictStream(chat("What is the capital of France?", Tokens=24), timeout=120))
        self.assertEqual(b"".join(c.message for c in chunks), reply.message)
        self.assertEqual(chunks[-1].tokens, reply.tokens)


if __name__ == "__main__":
    unittest.main()
