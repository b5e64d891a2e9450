"""Optional integrations with other training stacks (install their extras)."""
