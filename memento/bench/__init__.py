"""``memento bench ...`` suites. Each writes a JSON file of results (and prints a table)."""
