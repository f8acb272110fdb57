"""The input checks' rule families, each reading one text and yielding findings;
``..injection`` runs them on the text as sent and decoded."""
