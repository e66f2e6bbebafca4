"""HTTP routes: thin functions that validate, call one domain function and map the result."""
