"""Sume: the provider of the seed document (client, answers' meaning, webhooks, fake)."""
