"""The shell: the CLI, the one Settings class and the launchers that wire the layers together."""
