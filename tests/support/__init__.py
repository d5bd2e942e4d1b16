"""Test support shared by the tiers: the template, DynamoDB tables built from it, DynamoDB Local."""
