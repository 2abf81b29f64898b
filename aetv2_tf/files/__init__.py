"""Files the project writes and reads back: where it may write (`safe_paths`), what it wrote
(`provenance`), saved encoders and checkpoints (`saving`), the SavedModel export
(`savedmodel`), the presets in results/ (`presets`) and scalar logs (`scalar_logs`)."""
