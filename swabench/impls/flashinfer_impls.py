"""FlashInfer implementations (DESIGN section 2). Filled in by the FlashInfer issue."""
