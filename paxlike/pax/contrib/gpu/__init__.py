"""paxml.contrib.gpu / praxis.contrib.gpu: see scripts_gpu."""
