"""Evaluation harness: run any agent through the env, write resumable results and reports."""
