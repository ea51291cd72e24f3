"""What every service agrees on: errors, the experiment, settings, messages and their
codec, blob references, the broker's names. Imports no transport and no runtime."""
