"""reporting/: what people and dashboards read: the controller's reporter, terminal tables,
dashboards, the HTML/Markdown report."""
