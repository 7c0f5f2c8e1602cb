"""Population evaluation: member seeds in, mean rewards out, on one engine in-process or K engines as Ray actors.

Only seeds and scalars cross process boundaries; every engine applies the same update, so
weights never travel (except into the resume state a run writes now and then), and the
engines' weight checksums prove they agree.
"""
