"""What people read: Markdown tables, the section registry, reports, the findings page, figures."""
