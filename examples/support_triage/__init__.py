"""A support-triage agent: looks up orders, searches the FAQ, opens tickets."""
