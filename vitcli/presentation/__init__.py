"""Presentation: tables, CSV rows, JSON documents, figures and summaries built from experiment results."""
