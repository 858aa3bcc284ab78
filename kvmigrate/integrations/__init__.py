"""Import paths kept for configs written before the LiteLLM code moved to
kvmigrate.litellm_bridge: `litellm_plugin.proxy_handler_instance`, which users' LiteLLM
configs name. Nothing else lives here."""
