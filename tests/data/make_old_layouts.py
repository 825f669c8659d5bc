"""How msprobe_v1.0_L0 and msprobe_v1.2_L0 were made: the reference dump in msprobe_L0 (mindstudio-probe
26.x) rewritten in the layouts that older versions of the reference tool write, as read from their
writers (mindstudio-probe 1.0.1, 1.1.0, 1.2.0 and 8.1.0 on PyPI):

- 1.0.x: no "framework" key; backward records hold `grad_input` (gradients w.r.t. the module's inputs,
  saved under the `output` category) and `grad_output` (w.r.t. its outputs, category `input`), in that
  order; no `parameters` and no parameter-gradient records; stack.json is {record name: [frames]}.
- 1.1.x: backward records switched to `input` / `output` (as now).
- 1.2.x to 8.1.x: forward records of modules gain `parameters`; parameter gradients are one record
  `Module.<path>.<Class>.parameters_grad` per module (no call index; `[null]` until a gradient arrives);
  no "framework" key before 8.1; 8.1 has the {"0": [[names], [frames]]} stack.json of today.

Run from this folder: python make_old_layouts.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "msprobe_L0", "step0", "proc5051")


def load(name):
    with open(os.path.join(SOURCE, name)) as f:
        return json.load(f)


def stacks_by_name(stack):
    """{"0": [[names], [frames]]} -> {name: frames} (the older stack.json)."""
    return {name: frames for names, frames in stack.values() for name in names}


def write(folder, dump, stack, construct):
    os.makedirs(folder, exist_ok=True)
    for name, content in (("dump.json", dump), ("stack.json", stack), ("construct.json", construct)):
        with open(os.path.join(folder, name), "w") as f:
            json.dump(content, f, indent=1)


def v1_0(dump):
    data = {}
    for name, record in dump["data"].items():
        if ".parameters_grad." in name:
            continue
        if ".backward." in name:
            data[name] = {"grad_input": record["output"], "grad_output": record["input"]}
        else:
            data[name] = {k: v for k, v in record.items() if k != "parameters"}
    return {"task": dump["task"], "level": dump["level"], "dump_data_dir": None, "data": data}


def v1_2(dump):
    data = {}
    for name, record in dump["data"].items():
        if ".parameters_grad." in name:
            name = name.rsplit(".", 1)[0]  # Module.fc2.Linear.parameters_grad.0 -> ...parameters_grad
        data[name] = record
    return {"task": dump["task"], "level": dump["level"], "dump_data_dir": None, "data": data}


if __name__ == "__main__":
    dump, stack, construct = load("dump.json"), load("stack.json"), load("construct.json")
    write(os.path.join(HERE, "msprobe_v1.0_L0", "step0", "rank"), v1_0(dump), stacks_by_name(stack), construct)
    write(os.path.join(HERE, "msprobe_v1.2_L0", "step0", "rank"), v1_2(dump), stacks_by_name(stack), construct)
