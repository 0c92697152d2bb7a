"""The plugin as the core sees it: registration through pluggy, probe, claims."""

from importlib.metadata import entry_points

import pluggy

from uniccl import hookspecs


def test_every_hookspec_is_implemented(plugin):
    pm = pluggy.PluginManager("uniccl")
    pm.add_hookspecs(hookspecs)
    pm.register(plugin)
    pm.check_pending()
    specs = {name for name in dir(hookspecs) if name.startswith("uniccl_")}
    impls = {impl.function.__name__ for hook in pm.get_hookcallers(plugin) for impl in hook.get_hookimpls()}
    assert specs == impls
    assert pm.hook.uniccl_platform_info()[0]["name"] == "cpu"


def test_entry_point_loads_the_module(plugin):
    (ep,) = [ep for ep in entry_points(group="uniccl.plugins") if ep.name == "cpu"]
    assert ep.load() is plugin


def test_platform_info(plugin):
    info = plugin.uniccl_platform_info()
    assert (info["name"], info["version"], info["priority"]) == ("cpu", "0.1.0", 0)
    low, high = info["api_version"]
    assert (low, high) == plugin.UNICCL_PLUGIN_API
    assert hookspecs.UNICCL_PLUGIN_API_OLDEST <= high and low <= hookspecs.UNICCL_PLUGIN_API  # this core accepts it
    assert info["description"]


def test_probe(plugin):
    from uniccl_cpu import _kernels

    probe = plugin.uniccl_probe()
    assert probe["available"] is True and probe["reason"] == ""
    (device,) = probe["devices"]
    assert device["index"] == 0 and device["name"] and device["total_memory"] > 2**20
    assert probe["versions"]["compiler"]
    assert _kernels.variant() in probe["kernels"]


def test_claims_cpu_pointers_only(plugin):
    assert plugin.uniccl_dlpack_device_types() == [1]
    assert plugin.uniccl_claim_pointer(0x1000, 1, 0) == 0
    assert plugin.uniccl_claim_pointer(0x1000, 2, 0) is None


def test_no_native_collectives(plugin):
    assert not hasattr(plugin, "uniccl_transports")  # plugin API 2 has no such hook
    assert plugin.uniccl_native_collectives() is None
