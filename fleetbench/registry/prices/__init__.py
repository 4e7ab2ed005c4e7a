"""What tokens cost: each hardware class's price per hour, as an admin set it (`store`:
read, set, removed; `answers`: what `/v1/prices` takes and answers), and the price of a million
output tokens at a point of a curve (`rules`)."""
